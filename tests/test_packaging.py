"""The project's kernels install as ``kda_fuzz_kernels`` (no clash with PyPI's ``kernels``) and
import under that name from an uninstalled checkout too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_no_top_level_kernels_package_is_installed_or_needed() -> None:
    code = ("import sys, kda_fuzz_kernels.kda_decode as k, kda_fuzz.cli;"
            "print(k.__file__); print('kernels' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True,
                         text=True, check=True).stdout.split()
    assert Path(out[0]) == ROOT / "kernels" / "kda_decode" / "__init__.py"
    assert out[1] == "False"


def test_an_uninstalled_checkout_maps_the_name_onto_its_folder() -> None:
    # Drop whatever installed finder serves the name; kda_fuzz's own must take over.
    code = ("import sys\n"
            "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]\n"
            "sys.path[:] = [p for p in sys.path if 'site-packages' not in p or "
            "'torch' in str(__import__('os').listdir(p))]\n"
            "import kda_fuzz\n"
            "from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode as f\n"
            "print(f.__module__, sys.modules['kda_fuzz_kernels'].__file__)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    module, init = done.stdout.split()
    assert module.startswith("kda_fuzz_kernels.kda_decode")
    assert Path(init) == ROOT / "kernels" / "__init__.py"


def test_the_old_name_gets_a_hint(tmp_path: Path) -> None:
    code = ("from kda_fuzz.campaign.runner import TargetError, load_target\n"
            "try:\n"
            "    load_target('kernels.kda_decode:reference_kda_packed_decode')\n"
            "except TargetError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout
    assert "cannot import 'kernels.kda_decode'" in out and "'kda_fuzz_kernels'" in out
