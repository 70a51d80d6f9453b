"""run --precision / --channels-last (profiler.drivers.precision): what each precision runs, what the run records,
and the combinations that are bad input."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import stallscope
from torch import nn

from profiler.drivers.precision import Precision, PrecisionError


def _train(seen: dict[str, Any]):
    def train(model: Any, opt: Any, x: Any, y: Any, *, cast: Any, backward: Any, opt_step: Any) -> None:
        with cast:
            out = model(x)
            loss = (out.float() - y).square().mean()
        seen["out"], seen["x"] = out.dtype, x
        opt.zero_grad()
        backward(loss)
        opt_step(opt)

    return train


def test_bf16_runs_the_forward_in_bfloat16_and_keeps_the_weights_fp32() -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: dict[str, Any] = {}
    step = Precision("bf16").step(torch, "cpu", _train(seen))
    before = model.weight.detach().clone()
    step(model, opt, torch.randn(4, 8), torch.zeros(4, 1))
    assert seen["out"] == torch.bfloat16 and model.weight.dtype == torch.float32
    assert not torch.equal(before, model.weight)  # the optimizer stepped


def test_channels_last_moves_4d_inputs_only() -> None:
    model = nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: dict[str, Any] = {}
    step = Precision("default", channels_last=True).step(torch, "cpu", _train(seen))
    step(model, opt, torch.randn(2, 3, 8, 8), torch.zeros(2, 4, 6, 6))
    assert seen["x"].is_contiguous(memory_format=torch.channels_last)
    assert Precision("fp32").plain and not Precision("bf16").plain and not Precision(channels_last=True).plain


def _fake_cuda(major: int = 9, bf16: bool = True) -> Any:
    backends = SimpleNamespace(cudnn=SimpleNamespace(allow_tf32=True), cuda=SimpleNamespace(matmul=SimpleNamespace(
        allow_tf32=False)))  # fmt: skip
    cuda = SimpleNamespace(get_device_capability=lambda: (major, 0), is_bf16_supported=lambda: bf16)
    return SimpleNamespace(backends=backends, cuda=cuda)


def test_the_run_records_the_switches_in_effect() -> None:
    t = _fake_cuda()
    # PyTorch's default on CUDA: TF32 convolutions, full-precision matmuls; recorded as they are
    want = {"precision": "default", "autocast": None, "grad_scaler": False, "channels_last": False,
            "cudnn_tf32": True, "matmul_tf32": False}  # fmt: skip
    assert Precision().apply(t, "cuda") == want
    facts = Precision("fp32").apply(t, "cuda")
    assert (facts["cudnn_tf32"], facts["matmul_tf32"]) == (False, False)
    facts = Precision("tf32").apply(t, "cuda")
    assert (facts["cudnn_tf32"], facts["matmul_tf32"]) == (True, True)
    assert Precision("fp16").apply(t, "cuda")["grad_scaler"] is True
    assert "cudnn_tf32" not in Precision("bf16").apply(t, "cpu")


@pytest.mark.parametrize(
    ("precision", "device", "torch_mod", "says"),
    [
        (Precision("fp16"), "cpu", None, "--precision fp16 needs CUDA (the CPU's autocast runs bfloat16)"),
        (Precision("tf32"), "cpu", None, "--precision tf32 needs CUDA (TF32 is an NVIDIA GPU's)"),
        (Precision("tf32"), "cuda", _fake_cuda(major=7), "--precision tf32 needs compute capability 8.0 or later"),
        (Precision("bf16"), "cuda", _fake_cuda(bf16=False), "--precision bf16: this GPU has no bfloat16"),
        (Precision("half"), "cpu", None, "--precision 'half': allowed default, fp32, tf32, bf16, fp16"),
    ],
)
def test_what_a_device_cannot_run_is_one_line(precision: Precision, device: str, torch_mod: Any, says: str) -> None:
    with pytest.raises(PrecisionError) as err:
        precision.check(device, torch_mod)
    assert str(err.value).startswith(says) and "\n" not in str(err.value)
    Precision("bf16").check("cuda", _fake_cuda())  # what the device has passes


def test_on_a_simulated_device_the_flags_mean_what_they_mean_on_cuda_and_go_into_its_string() -> None:
    # issue #57: `--device sim:h100,precision=bf16 --channels-last` and `--precision bf16` on sim: exited 2 where a
    # real run takes them; the twin of a run changes only --device
    peaks = {"fp32": 67.0, "tf32": 494.7, "amp": 989.4}
    assert Precision("bf16").sim_device("sim:h100", "h100", peaks) == "sim:h100,precision=bf16"
    assert (
        Precision("fp32").sim_device("sim:h100,efficiency=0.2", "h100", peaks)
        == "sim:h100,efficiency=0.2,precision=fp32"
    )
    assert Precision().sim_device("sim:h100", "h100", peaks) == "sim:h100"  # default: the device's own
    assert Precision("fp16").sim_device("sim:h100,precision=amp", "h100", peaks) == "sim:h100,precision=amp"  # agree
    # the refusals a real GPU of that kind gives: no TF32 and no bfloat16 before Ampere, no FP16 peak on a K80
    volta, kepler = {"fp32": 15.7, "amp": 125.0}, {"fp32": 4.37}
    for p, name, have, says in [
        ("tf32", "v100", volta, "--precision tf32: the simulated v100 has no tf32 peak"),
        ("bf16", "v100", volta, "--precision bf16: the simulated v100 has no bf16 peak"),
        ("fp16", "k80", kepler, "--precision fp16: the simulated k80 has no fp16 peak"),
    ]:
        with pytest.raises(PrecisionError) as err:
            Precision(p).sim_device(f"sim:{name}", name, have)
        assert str(err.value).startswith(says) and "allowed default, fp32" in str(err.value)
    with pytest.raises(PrecisionError, match="name different precisions: give one of them"):
        Precision("fp32").sim_device("sim:h100,precision=amp", "h100", peaks)
    # --channels-last is recorded, and said to change nothing the simulator models
    facts = Precision("bf16", channels_last=True).sim_facts("amp")
    assert facts["channels_last"] is True and "has no memory format" in str(facts["channels_last_note"])


def test_a_twin_takes_the_real_runs_flags(tmp_path: Any) -> None:
    out = tmp_path / "r"
    res = stallscope(
        "run", "fashion-vgg", "--device", "sim:h100", "--precision", "bf16", "--channels-last", "--steps", "2",
        "--warmup", "1", "--no-live", "--json", "--out", str(out),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(res.stdout)
    assert summary["device"]["sim"]["precision"] == "amp" and summary["device"]["sim"]["device"].startswith("sim:h100")
    report = stallscope("report", str(out))
    assert "channels_last" in report.stdout and "has no memory format" in report.stdout, report.stdout


def test_the_command_says_it_in_one_line_and_exits_2(tmp_path: Any) -> None:
    res = stallscope(
        "run", "fashion-vgg", "--precision", "fp16", "--steps", "2", "--no-live", "--out", str(tmp_path / "r")
    )
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "stallscope: error: --precision fp16 needs CUDA (the CPU's autocast runs bfloat16): allowed on a CPU "
        "default, fp32, bf16"
    ]
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("verb", ["sweep", "tune"])
def test_sweep_and_tune_check_the_precision_as_run_does(tmp_path: Any, verb: str) -> None:
    res = stallscope(verb, "fashion-vgg", "--device", "cpu", "--precision", "fp16", "--out", str(tmp_path / "s"))
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].startswith(
        "stallscope: error: --precision fp16 needs CUDA (the CPU's autocast runs bfloat16)"
    )
    # a command's training is its own: --precision does not reach it
    res = stallscope(verb, "--precision", "bf16", "--", "python", "train.py")
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1] == (
        f"stallscope: error: --precision: a scenario's option; {verb} -- CMD changes only the command's DataLoader "
        "knobs"
    )


@pytest.mark.slow
def test_a_sweep_trains_every_cell_in_the_precision_asked(tmp_path: Any) -> None:
    import json

    res = stallscope(
        "sweep", "fashion-vgg", "--device", "cpu", "--precision", "bf16", "--batch-sizes", "8", "--workers", "0",
        "--steps", "2", "--warmup", "1", "--no-live", "--out", str(tmp_path / "s"),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    (summary,) = (tmp_path / "s").glob("*/summary.json")
    ran = json.loads(summary.read_text())["precision"]
    assert ran["precision"] == "bf16" and ran["autocast"] == "bfloat16"
