"""perfdoctor: a command-line doctor for PyTorch training performance."""

__version__ = "0.1.0"
