"""Running Helion and Triton kernels without a GPU (Triton's interpreter, Helion's eager mode).
"""

# the distributions whose versions a corpus file records beside python and torch
RUNTIMES = ("triton", "helion")
