"""``python -m torch_npu_smi info ...``: the npu-smi command."""
import sys

from . import main

sys.exit(main())
