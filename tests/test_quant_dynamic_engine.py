"""``int8-dynamic`` on CPU is exact at the full 8-bit activation range on whatever CPU runs the tests.

fbgemm and oneDNN without VNNI (AVX2-only CPUs) add pairs of u8 x s8 products in int16 and saturate; there the
weights are packed for QNNPACK instead (specdec.quant.backends.engine_saturates). The subprocess tests force
fbgemm's AVX2 kernels (``FBGEMM_ENABLE_INSTRUCTIONS``), so a machine with VNNI checks the AVX2 path too."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from specdec.quant import backends

pytestmark = pytest.mark.skipif(not {"x86", "fbgemm", "qnnpack", "onednn"} & set(torch.backends.quantized.supported_engines),
                                reason="no torch.ao quantized CPU engine")


def _saturating_layer_error() -> float:
    """Relative error of int8-dynamic's Linear, built as ``quantize`` builds it, on the input that saturates an
    int16 pair sum: all weights at +127 and all activations at code 255."""
    k = 64
    holder = nn.Sequential(nn.Linear(k, 3, bias=False, device="cpu"))
    holder[0].weight.data.fill_(0.5)
    backends.torch_ao_dynamic_int8(holder, [(holder, "0", holder[0])], None, "cpu")
    x = torch.ones(2, k, device="cpu")
    x[:, 0] = 0.0
    want = x @ torch.full((3, k), 0.5, device="cpu").T
    return float(((holder(x) - want).abs() / want.abs()).max())


def test_the_dynamic_int8_linear_is_exact_where_pairs_would_saturate():
    assert _saturating_layer_error() < 0.02


def test_int8_dynamic_leaves_the_users_quantized_engine_as_it_was():
    before = torch.backends.quantized.engine
    _saturating_layer_error()
    assert torch.backends.quantized.engine == before


_PROBE = """
import json, warnings
warnings.filterwarnings("ignore")
import torch
from specdec.quant import backends
from test_quant_dynamic_engine import _saturating_layer_error
print(json.dumps({"fbgemm_saturates": backends.engine_saturates("fbgemm"),
                  "engine": backends._dynamic_engine()[0], "error": _saturating_layer_error()}))
"""


@pytest.mark.skipif("fbgemm" not in torch.backends.quantized.supported_engines, reason="no fbgemm in this torch")
def test_on_avx2_kernels_the_probe_sees_saturation_and_packs_for_an_exact_engine():
    env = dict(os.environ, FBGEMM_ENABLE_INSTRUCTIONS="AVX2", ONEDNN_MAX_CPU_ISA="AVX2",
               PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["fbgemm_saturates"] is True  # the negative control: AVX2's fbgemm kernel is wrong at full range
    assert result["engine"] != "fbgemm" and result["error"] < 0.02
