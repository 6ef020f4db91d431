"""The packed gated delta rule (GDN) decode family: its contract and layouts.
"""
