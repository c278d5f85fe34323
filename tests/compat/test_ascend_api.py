"""The Ascend adapter's own names that libraries call: storage formats as metadata,
compile mode, ACL options, torch.npu.config."""
import pytest
import torch

import torch_npu


def test_storage_formats_are_kept_and_reported_and_results_unchanged():
    x = torch.rand(2, 3, 4, 5).npu()
    assert torch_npu.get_npu_format(x) == torch_npu.Format.NCHW == 0          # a 4-d tensor's default
    assert torch_npu.get_npu_format(torch.ones(2, 2, device="npu")) == torch_npu.Format.ND
    nz = torch_npu.npu_format_cast(x, 29)
    assert torch_npu.get_npu_format(nz) == torch_npu.Format.FRACTAL_NZ and str(torch_npu.Format(29)) == "FRACTAL_NZ"
    assert torch_npu.get_npu_format(x) == torch_npu.Format.NCHW               # a new tensor: x keeps its own
    assert torch.equal(nz.cpu(), x.cpu()) and nz.data_ptr() != x.data_ptr()
    y = torch.ones(4, 4, device="npu")
    assert torch_npu.npu_format_cast_(y, nz) is y and torch_npu.get_npu_format(y) == torch_npu.Format.FRACTAL_NZ
    torch_npu.npu_format_cast_(y, torch_npu.Format.ND)
    assert torch_npu.get_npu_format(y) == 2
    torch.testing.assert_close((nz @ nz.transpose(-1, -2)).cpu(), x.cpu() @ x.cpu().transpose(-1, -2))
    with pytest.raises(ValueError, match="not a storage format"):
        torch_npu.npu_format_cast(x, 5)
    with pytest.raises(TypeError, match="expected an npu tensor"):
        torch_npu.get_npu_format(torch.ones(2))


def test_compile_mode_options_and_config():
    assert torch.npu.is_jit_compile_false()
    torch.npu.set_compile_mode(jit_compile=True)
    try:
        assert not torch.npu.is_jit_compile_false()
    finally:
        torch.npu.set_compile_mode(jit_compile=False)
    torch.npu.set_option({"ACL_OP_COMPILER_CACHE_MODE": "enable", "ACL_PRECISION_MODE": "allow_fp32_to_fp16"})
    assert torch.npu.get_option()["ACL_OP_COMPILER_CACHE_MODE"] == "enable"
    with pytest.raises(TypeError, match="dict"):
        torch.npu.set_option("ACL_OP_COMPILER_CACHE_MODE=enable")
    assert torch.npu.config.allow_internal_format is False
    torch.npu.config.allow_internal_format = True
    torch.npu.config.allow_internal_format = False
    with pytest.raises(TypeError, match="must be a bool"):
        torch.npu.config.allow_internal_format = "yes"
    with pytest.raises(AttributeError, match="has no setting"):
        torch.npu.config.allow_internal_fromat = True


def test_cann_version_comes_from_an_installed_toolkit(tmp_path, monkeypatch):
    import platform

    from torch_npu.npu.utils import get_cann_version as module_version
    from torch_npu.utils.collect_env import get_cann_version

    monkeypatch.setattr("torch_npu.utils.collect_env._DEFAULT_TOOLKIT", str(tmp_path / "none"))
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    monkeypatch.setenv("ASCEND_HOME_PATH", str(tmp_path))
    assert get_cann_version() == "not known" and module_version() == ""
    info = tmp_path / f"{platform.machine()}-linux" / "ascend_toolkit_install.info"
    info.parent.mkdir()
    info.write_text('package_name=Ascend-cann-toolkit\nversion=8.0.RC3\ninnerversion=V100R001C19\n')
    assert get_cann_version() == "8.0.RC3" == torch_npu.utils.get_cann_version()
    assert module_version("CANN") == "8.0.RC3" and module_version("DRIVER") == ""


def test_is_hccl_available_as_the_ascend_adapter_adds_it():
    import torch.distributed as dist
    from torch.distributed import is_hccl_available   # vllm-ascend imports it so

    assert is_hccl_available() is True and dist.is_hccl_available is torch_npu.distributed.is_hccl_available
    assert "hccl" in dist.Backend.backend_list


def test_process_group_hccl_from_the_extensions_c10d_module():
    from torch_npu._C._distributed_c10d import ProcessGroupHCCL   # vllm-ascend imports it so

    assert ProcessGroupHCCL is torch_npu.distributed.ProcessGroupHCCL
    assert isinstance(torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options(), ProcessGroupHCCL.Options)
