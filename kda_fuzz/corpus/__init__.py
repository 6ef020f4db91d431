"""The corpus: the file format, saving, loading and replaying entries, merging folders.
"""
