"""A Helion kernel that gives no config of its own runs Helion's default config unless the
user asks for autotuning; a kernel's own config is left as it is."""

from __future__ import annotations

import types
from typing import Any

import pytest

from kda_fuzz.execution import configs


class _Spec:
    def default_config(self) -> str:
        return "DEFAULT"


class _Kernel:
    def __init__(self, own: list[str] | None = None, force: bool = False) -> None:
        self.configs = own or []
        self.settings = types.SimpleNamespace(force_autotune=force)


def _fake_helion() -> Any:
    """A module with a BoundKernel shaped as Helion 1.4's and 1.5's: it records whether it
    autotuned and which config it was given."""

    class BoundKernel:
        def __init__(self, kernel: _Kernel) -> None:
            self.kernel, self._config, self.config_spec = kernel, None, _Spec()
            self.tuned = False

        def _implicit_config(self) -> Any:
            if self._config is not None:
                return self._config
            return self.kernel.configs[0] if len(self.kernel.configs) == 1 else None

        def set_config(self, config: Any) -> None:
            self._config = config

        def ensure_config_exists(self, args: Any) -> None:
            if self._config is not None:
                return
            implicit = self._implicit_config()
            if implicit is not None:
                self.set_config(implicit)
            else:
                self.tuned = True
                self.set_config("TUNED")

    module = types.ModuleType("fake_helion_runtime_kernel")
    module.BoundKernel = BoundKernel  # type: ignore[attr-defined]
    configs.default_config_hook(module)
    return module


@pytest.fixture
def no_autotune_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv(configs.AUTOTUNE_ENV, "0")  # restored after the test
    for name in ("HELION_FORCE_AUTOTUNE", "HELION_AUTOTUNE_EFFORT",
                 "HELION_USE_DEFAULT_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_a_kernel_without_a_config_runs_the_default_config(no_autotune_env: Any) -> None:
    m = _fake_helion()
    bound = m.BoundKernel(_Kernel())
    bound.ensure_config_exists(())
    assert (bound.tuned, bound._config) == (False, "DEFAULT")


@pytest.mark.parametrize("env", [(configs.AUTOTUNE_ENV, "1"), ("HELION_FORCE_AUTOTUNE", "1"),
                                 ("HELION_AUTOTUNE_EFFORT", "quick"),
                                 ("HELION_USE_DEFAULT_CONFIG", "0")])
def test_autotuning_asked_for_autotunes(no_autotune_env: Any, env: tuple[str, str]) -> None:
    no_autotune_env.setenv(*env)
    m = _fake_helion()
    bound = m.BoundKernel(_Kernel())
    bound.ensure_config_exists(())
    assert (bound.tuned, bound._config) == (True, "TUNED")


def test_a_kernels_own_config_is_kept(no_autotune_env: Any) -> None:
    m = _fake_helion()
    one = m.BoundKernel(_Kernel(["MINE"]))
    one.ensure_config_exists(())
    assert (one.tuned, one._config) == (False, "MINE")
    several = m.BoundKernel(_Kernel(["A", "B"]))  # Helion picks among them, as it would
    several.ensure_config_exists(())
    assert several.tuned
    forced = m.BoundKernel(_Kernel(force=True))  # the kernel's settings force autotuning
    forced.ensure_config_exists(())
    assert forced.tuned


def test_the_hook_wraps_once(no_autotune_env: Any) -> None:
    m = _fake_helion()
    wrapped = m.BoundKernel.ensure_config_exists
    configs.default_config_hook(m)
    assert m.BoundKernel.ensure_config_exists is wrapped


def test_the_start_line_says_which(no_autotune_env: Any) -> None:
    assert "default config" in configs.policy_note("cpu")
    assert "--helion-autotune to autotune" in configs.policy_note("cuda")
    configs.ask_autotuning()
    assert "autotune (as Helion would)" in configs.policy_note("cuda")


def test_a_real_helion_kernel_gets_the_hook_when_a_target_is_loaded() -> None:
    """Loading any target installs the hook on Helion (imported or not yet)."""
    from kda_fuzz.engine.targets import load_target
    from kda_fuzz.execution.patching import MARK

    load_target("tests.helion_config_bug:decode")
    import sys

    hk = sys.modules["helion.runtime.kernel"]  # (helion.runtime.kernel is also a function)

    assert any("default_config_hook" in t
               for t in getattr(hk.BoundKernel.ensure_config_exists, MARK, ()))


def test_a_fitted_config_runs_only_if_the_kernels_config_space_accepts_it() -> None:
    """A drawn tensor-descriptor config fitted to pointer indexing is checked against the
    kernel's own config space: one it rejects is skipped (ConfigUnavailable), not run."""
    class Spec:
        def normalize(self, values: dict) -> None:
            if values.get("block_sizes") == [16]:
                raise ValueError("block_sizes[0] too large for pointer loads")

    bound = types.SimpleNamespace(config_spec=Spec())
    configs._check_fitted(bound, {"block_sizes": [8], "indexing": "pointer"}, "_decode")
    with pytest.raises(configs.ConfigUnavailable, match="not one its config space accepts"):
        configs._check_fitted(bound, {"block_sizes": [16], "indexing": "pointer"}, "_decode")
    alt = configs.Alternative(index=0, seed=1)
    alt.adjusted = "tensor-descriptor indexing run as pointer indexing: argument(s) a ..."
    assert configs.note(alt)["fitted"].startswith("tensor-descriptor")
