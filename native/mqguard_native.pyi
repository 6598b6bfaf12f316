"""Type information of the mqguard_native extension module."""

__version__: str
