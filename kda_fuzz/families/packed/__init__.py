"""What the packed decode families share: the fused GPU judge and the shrinker.
"""
