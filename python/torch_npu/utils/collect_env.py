"""torch_npu.utils.collect_env: the installed CANN toolkit's version, where libraries read it.

MindSpeed, vllm-ascend and others ask ``get_cann_version()`` to pick code paths. The answer
comes from a CANN toolkit's install record (``<toolkit>/<arch>-linux/ascend_toolkit_install.info``,
found through ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME or the default install path), as the
Ascend adapter reads it. The emulated npu needs no toolkit: without one the answer is
"not known", the Ascend adapter's own answer when it finds none, and code that compares
versions should treat it as such.
"""
import os
import platform
from typing import Optional

__all__ = ["get_cann_version"]

_DEFAULT_TOOLKIT = "/usr/local/Ascend/ascend-toolkit/latest"


def _toolkit_info_path() -> Optional[str]:
    roots = [os.environ.get("ASCEND_HOME_PATH"), os.environ.get("ASCEND_TOOLKIT_HOME"), _DEFAULT_TOOLKIT]
    for root in filter(None, roots):
        path = os.path.join(root, f"{platform.machine()}-linux", "ascend_toolkit_install.info")
        if os.path.isfile(path):
            return path
    return None


def get_cann_version() -> str:
    """The CANN toolkit's version ("8.0.RC3", ...), or "not known" when none is installed."""
    path = _toolkit_info_path()
    if path is None:
        return "not known"
    with open(path, encoding="utf-8", errors="replace") as info:
        for line in info:
            key, _, value = line.strip().partition("=")
            if key == "version" and value:
                return value.strip().strip('"')
    return "not known"
