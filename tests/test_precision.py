"""The TF32 setting (verify/precision.py): set explicitly by the benchmarks, printed in their machine line."""
import pytest
import torch

from draftkit.eval.report import machine_line
from draftkit.verify.precision import set_tf32, tf32_matmul


@pytest.fixture
def restore_precision():
    saved = (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    yield
    torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = saved


def test_on_off_and_keep(restore_precision):
    set_tf32("on")
    assert tf32_matmul() and torch.backends.cudnn.conv.fp32_precision == "tf32"
    set_tf32("keep")
    assert tf32_matmul()
    set_tf32("off")
    assert not tf32_matmul() and torch.backends.cuda.matmul.fp32_precision == "ieee"
    assert torch.backends.cudnn.conv.fp32_precision == "ieee"
    with pytest.raises(ValueError, match="tf32 must be one of off, on, keep, got 'yes'"):
        set_tf32("yes")


def test_the_machine_line_says_tf32_on_a_gpu_only(restore_precision, monkeypatch):
    assert "TF32" not in machine_line() or torch.cuda.is_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    set_tf32("on")
    assert machine_line().startswith("NVIDIA H200 (TF32 on),")
    set_tf32("off")
    assert machine_line().startswith("NVIDIA H200 (TF32 off),")



def test_the_machine_line_names_the_cpu_and_its_bf16_units(tmp_path):
    from draftkit.eval.report import cpu_name

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU 9000\nflags\t\t: fpu sse avx512f avx512_bf16 amx_bf16\n"
                    "processor\t: 1\nmodel name\t: Some CPU 9000\n")
    assert cpu_name(str(info)) == "Some CPU 9000, AMX"
    info.write_text("model name\t: Other CPU\nflags\t\t: fpu avx512_bf16\n")
    assert cpu_name(str(info)) == "Other CPU, AVX512-BF16"
    assert cpu_name(str(tmp_path / "absent"))  # no cpuinfo: the platform's name
