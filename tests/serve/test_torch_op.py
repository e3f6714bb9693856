"""``torch.ops.flashtune.attention`` without a GPU: registration, fake implementation, torch.compile, grad.

The kernel call behind the operator (``tuner.serve._torch_op._run``) is replaced by a float32
reference on CPU tensors, so everything PyTorch does around it (schema, dispatch, fake
tensors, Dynamo, AOTAutograd, Inductor) runs for real.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import tuner  # noqa: E402
import tuner.serve._torch_op as torch_op  # noqa: E402
from tuner.serve import AttentionError, register_torch_op  # noqa: E402

register_torch_op()  # tuner may have been imported before PyTorch (then importing tuner registered nothing)


def reference(q, k, v, causal, softmax_scale, family, config, tuned):
    """(O, LSE) in float32 math, O in q's dtype: what the kernel computes (bottom-right causal mask)."""
    _batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, group = k.shape[1], heads_q // k.shape[2]
    qf, kf, vf = (x.float().transpose(1, 2) for x in (q, k, v))
    kf, vf = kf.repeat_interleave(group, 1), vf.repeat_interleave(group, 1)
    scores = qf @ kf.transpose(-1, -2) * (softmax_scale or 1 / math.sqrt(head_dim))
    if causal:
        visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool).tril(seqlen_k - seqlen_q)
        scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    return (torch.softmax(scores, -1) @ vf).transpose(1, 2).to(q.dtype).contiguous(), lse


@pytest.fixture
def cpu_kernel(monkeypatch):
    calls = []

    def run(*args):
        calls.append(args[3:])
        return reference(*args)

    monkeypatch.setattr(torch_op, "_run", run)
    torch._dynamo.reset()
    yield calls
    torch._dynamo.reset()


def inputs(dtype=torch.float16, seqlen_q=96, seqlen_k=128, heads_q=4, heads_kv=2):
    gen = torch.Generator().manual_seed(0)
    return (
        torch.randn(2, seqlen_q, heads_q, 64, dtype=dtype, generator=gen),
        torch.randn(2, seqlen_k, heads_kv, 64, dtype=dtype, generator=gen),
        torch.randn(2, seqlen_k, heads_kv, 64, dtype=dtype, generator=gen),
    )


def test_the_operator_is_registered_with_its_schema():
    schema = str(torch.ops.flashtune.attention.default._schema)
    assert schema == (
        "flashtune::attention(Tensor q, Tensor k, Tensor v, bool causal=False, "
        "float? softmax_scale=None, "
        'str family="auto", str? config=None, str? tuned=None) -> (Tensor, Tensor)'
    )


def test_fake_implementation_gives_the_result_shapes_and_checks_inputs():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k, v = (torch.empty(2, 100, 8, 128, dtype=torch.bfloat16) for _ in range(3))
        strided = torch.empty(2, 100, 2, 8, 128, dtype=torch.bfloat16)[:, :, 0]
        o, lse = torch.ops.flashtune.attention(strided, k[:, :, :2], v[:, :, :2], True)
        assert o.shape == q.shape and o.dtype == torch.bfloat16 and o.is_contiguous()
        assert lse.shape == (2, 8, 100) and lse.dtype == torch.float32
        for args, message in (
            ((q.float(), k.float(), v.float()), "float16 or bfloat16"),
            ((q, k, v[:, :50]), "same shape"),
            ((q, k[:, :, :3], v[:, :, :3]), "must divide"),
            ((q[0], k, v), r"\[batch, seqlen, heads, head_dim\]"),
            ((q, k.half(), v.half()), "share a dtype"),
        ):
            with pytest.raises(AttentionError, match=message):
                torch.ops.flashtune.attention(*args)


def test_opcheck_fake_and_real_agree(cpu_kernel):
    """PyTorch's own operator checks: schema, fake tensor against the real result, AOT dispatch."""
    q, k, v = inputs(dtype=torch.bfloat16)
    strided = torch.randn(2, 96, 2, 4, 64, dtype=torch.bfloat16)[:, :, 1]
    for args in ((q, k, v, True), (strided, k, v, False, 0.3)):
        torch.library.opcheck(
            torch.ops.flashtune.attention.default,
            args,
            test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"),
        )


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_traces_the_operator_and_tuner_attention(cpu_kernel, backend):
    """No graph break (fullgraph=True), the eager result, and tuner.attention traced as the operator."""
    q, k, v = inputs()

    def model(q, k, v):
        o, lse = torch.ops.flashtune.attention(q * 0.5, k, v, True, None, "sm80", "auto", "dispatch.json")
        o2 = tuner.attention(q, k, v, causal=False, softmax_scale=0.2, config="best.h")
        return o.float() + o2.float(), lse.exp().sum(-1)

    o, lse = reference(q * 0.5, k, v, True, None, "", None, None)
    eager = (o.float() + reference(q, k, v, False, 0.2, "", None, None)[0].float(), lse.exp().sum(-1))
    compiled = torch.compile(model, fullgraph=True, backend=backend)(q, k, v)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b)
    # the compiled graph called the operator, with the string arguments as given
    assert (True, None, "sm80", "auto", "dispatch.json") in cpu_kernel
    assert (False, 0.2, "auto", "best.h", None) in cpu_kernel
    assert torch._dynamo.explain(model)(q, k, v).graph_break_count == 0


def test_compile_refuses_a_dict_config_with_one_line(cpu_kernel):
    q, k, v = inputs()
    with pytest.raises(Exception, match=r"inside torch.compile, config must be None or a string"):
        torch.compile(
            lambda q, k, v: tuner.attention(q, k, v, config={"block_m": 64}), fullgraph=True, backend="aot_eager"
        )(q, k, v)


def test_inputs_that_require_grad_get_a_forward_only_error(cpu_kernel):
    q, k, v = inputs()
    q.requires_grad_()
    with pytest.raises(AttentionError, match="forward-only"):
        torch.ops.flashtune.attention(q, k, v)
    with pytest.raises(Exception, match="forward-only"):
        torch.compile(lambda q, k, v: torch.ops.flashtune.attention(q, k, v)[0], fullgraph=True, backend="aot_eager")(
            q, k, v
        )
    with torch.no_grad():  # inference with tensors that require grad: no error, nothing detached silently
        o, _ = torch.ops.flashtune.attention(q, k, v)
        torch.testing.assert_close(o, reference(q, k, v, False, None, "", None, None)[0])


def test_registering_again_is_a_no_op():
    """Importing tuner registered the operator; every later call (each new plan on tensors makes one, from any
    thread) answers without registering twice, which Dynamo would refuse."""
    import threading

    from tuner.serve import register_torch_op

    answers = []
    threads = [threading.Thread(target=lambda: answers.append(register_torch_op())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [True] * 4 and register_torch_op() is True


def test_import_tuner_registers_the_operator_once_pytorch_is_loaded():
    probe = (
        "import torch, tuner, sys; assert 'tuner.serve._torch_op' in sys.modules; "
        "assert torch.ops.flashtune.attention.default is not None"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    probe = "import tuner, sys; assert 'tuner.serve._torch_op' not in sys.modules and 'torch' not in sys.modules"
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
