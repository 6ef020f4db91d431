"""The packed KDA decode family: its contract, layouts and GPU-scale stratum.
"""
