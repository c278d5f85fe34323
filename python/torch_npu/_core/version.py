"""torch_npu's version (``torch_npu.__version__``), where any module can read it without
importing the package's ``__init__``."""
__version__ = "0.1.0"
