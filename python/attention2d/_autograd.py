"""The torch autograd function over an engine (forward and backward, the LSE's gradient), the
forward for numpy arrays, and the backward from the caller's tensors (the torch.library op's)."""

from ._channel import Error, torch
from ._tensors import _engine_ready, _stream_of, _torch_empty_on, _view


def _run_forward(engine, q, k, v, sinks_address, empty, stream=0):
    """O and LSE in the caller's layout; also the plan-layout Q, K, V, O, LSE the backward
    needs (the same tensors when the layouts agree). `empty(shape, dtype)` makes tensors (on the
    inputs' device); `stream`: torch's current CUDA stream there (0 on the CPU)."""
    b, n, h, d = q.shape
    if engine.exchanges:
        m = engine.plan_tokens
        qp, kp, vp = (empty((b, m) + tuple(x.shape[2:]), x.dtype) for x in (q, k, v))
        engine.exchange_in([(_view(x), _view(y)) for x, y in ((q, qp), (k, kp), (v, vp))], [],
                           False, stream)
    else:
        m, qp, kp, vp = n, q, k, v
    op = empty(qp.shape, q.dtype)
    lsep = empty((b, h, m), "float32")
    engine.forward(_view(qp), _view(kp), _view(vp), _view(op), _view(lsep), sinks_address, stream)
    if not engine.exchanges:
        return op, lsep, (qp, kp, vp, op, lsep)
    out = empty(q.shape, q.dtype)
    lse = empty((b, h, n), "float32")
    engine.exchange_out([(_view(op), _view(out))], [(_view(lsep), _view(lse))], False, stream)
    return out, lse, (qp, kp, vp, op, lsep)


if torch is not None:

    class _AttentionFunction(torch.autograd.Function):
        """The engine's forward and backward; saves only N/P-sized shards (in the plan's layout,
        so that the backward moves only dO in and dQ, dK, dV out) and the fp32 LSE."""

        @staticmethod
        def forward(ctx, q, k, v, sinks, engine, chan, lse_wanted):
            q, k, v = _engine_ready(q), _engine_ready(k), _engine_ready(v)
            sink_values = None
            if sinks is not None:  # the kernels read the sinks on the host ([heads] floats)
                sink_values = sinks.detach().to("cpu", torch.float32).contiguous()
            stream = _stream_of(q)
            out, lse, saved = _run_forward(engine, q, k, v, 0 if sink_values is None
                                           else sink_values.data_ptr(), _torch_empty_on(q.device),
                                           stream)
            ctx.sinks_device = None if sinks is None else sinks.device
            ctx.engine = engine
            ctx.chan = chan
            ctx.has_sinks = sinks is not None
            ctx.lse_wanted = lse_wanted
            ctx.user_shapes = (q.shape, k.shape, v.shape)
            ctx.save_for_backward(*saved, sink_values if sink_values is not None
                                  else torch.empty(0))
            if lse_wanted:
                ctx.set_materialize_grads(False)  # an unused output's gradient is None
            else:
                ctx.mark_non_differentiable(lse)  # never returned to the caller
            return out, lse

        @staticmethod
        def backward(ctx, d_out, d_lse):
            if torch.is_grad_enabled():
                raise Error("attention2d's backward is not differentiable itself: "
                            "create_graph=True (double backward, gradient penalties through "
                            "the attention) is not supported")
            engine = ctx.engine
            qp, kp, vp, op, lsep, sink_values = ctx.saved_tensors
            # Whether any rank's LSE carries a gradient (the backward is collective: every rank
            # takes the same path).
            # (a gradient of zeros adds nothing: no work, and no refusal with sinks or softcap)
            lse_gradient = ctx.lse_wanted and any(ctx.chan.allgather(
                d_lse is not None and bool(d_lse.any()), "backward arguments"))
            if lse_gradient:
                problem = engine.problem
                refusal = ""
                if ctx.has_sinks or problem.softcap:
                    refusal = ("the gradient through the returned LSE is computed without sinks "
                               "and softcap only: detach the LSE (lse.detach()) or drop %s"
                               % ("sinks" if ctx.has_sinks else "softcap"))
                ctx.chan.raise_collectively(refusal, phase="backward arguments")
            device, stream = qp.device, _stream_of(qp)
            if d_out is None:
                d_out = torch.zeros(ctx.user_shapes[0], dtype=qp.dtype, device=device)
            # autograd's dO may come in any layout: copied where the kernels cannot read it.
            d_out = d_out.to(device=device, dtype=qp.dtype)
            if d_out.dim() >= 1 and d_out.shape[-1] > 1 and d_out.stride(-1) != 1:
                d_out = d_out.contiguous()
            d_out = _engine_ready(d_out)
            if engine.exchanges:
                dop = torch.empty(op.shape, dtype=op.dtype, device=device)
                engine.exchange_in([(_view(d_out), _view(dop))], [], True, stream)
            else:
                dop = d_out
            dqp, dkp, dvp = (torch.empty(x.shape, dtype=x.dtype, device=device)
                             for x in (qp, kp, vp))
            dsink = torch.zeros(sink_values.shape, dtype=torch.float32)  # host: backend.hpp
            engine.backward(_view(qp), _view(kp), _view(vp), _view(op), _view(dop), _view(lsep),
                            _view(dqp), _view(dkp), _view(dvp),
                            sink_values.data_ptr() if ctx.has_sinks else 0,
                            dsink.data_ptr() if ctx.has_sinks else 0, stream)
            if lse_gradient:
                _add_lse_gradient(engine, d_lse, ctx.user_shapes[0][1], qp, kp, vp, op, lsep, dqp,
                                  dkp)
            if engine.exchanges:
                dq, dk, dv = (torch.empty(shape, dtype=qp.dtype, device=device)
                              for shape in ctx.user_shapes)
                engine.exchange_out([(_view(dqp), _view(dq)), (_view(dkp), _view(dk)),
                                     (_view(dvp), _view(dv))], [], True, stream)
            else:
                dq, dk, dv = dqp, dkp, dvp
            # The engine gives every rank the sum over all ranks' rows. The sinks are a replicated
            # parameter, whose gradients a sequence-sharded model sums over the ranks like every
            # other: each rank returns its 1/P of the sum, so that sum is exact.
            d_sinks = (dsink / engine.size).to(ctx.sinks_device) if ctx.has_sinks else None
            return dq, dk, dv, d_sinks, None, None, None

    def _add_lse_gradient(engine, d_lse, user_tokens, qp, kp, vp, op, lsep, dqp, dkp):
        """Adds the LSE's gradient to dQ and dK (plan layout). lse_i = log sum_j exp(s_ij) with
        s_ij = scale q_i . k_j (masked): d lse_i / d q_i = scale (P K)_i, the attention output
        with K as the values (one more forward), and d lse_i / d k_j = scale p_ij q_i, summed over
        i: dV of a backward whose dO is scale * dlse_i * q_i (one more backward)."""
        b, m, h, d = qp.shape
        scale = engine.problem.scale or d ** -0.5
        device, stream = qp.device, _stream_of(qp)
        if d_lse is None:  # this rank's LSE is unused, another rank's is not
            d_lse = torch.zeros((b, h, user_tokens), dtype=torch.float32, device=device)
        d_lse = d_lse.to(device=device, dtype=torch.float32).contiguous()
        if engine.exchanges:
            d_lsep = torch.empty(lsep.shape, dtype=torch.float32, device=device)
            engine.exchange_in([], [(_view(d_lse), _view(d_lsep))], True, stream)
        else:
            d_lsep = d_lse
        weight = (scale * d_lsep).transpose(1, 2).unsqueeze(-1)  # [b, m, h, 1]
        pk = torch.empty(qp.shape, dtype=qp.dtype, device=device)
        # kept alive: the engine writes it
        lse_k = torch.empty(lsep.shape, dtype=torch.float32, device=device)
        engine.forward(_view(qp), _view(kp), _view(kp), _view(pk), _view(lse_k), 0, stream)
        dqp += (weight * pk.float()).to(dqp.dtype)
        d_out = (weight * qp.float()).to(qp.dtype).contiguous()
        scratch = [torch.empty(x.shape, dtype=x.dtype, device=device) for x in (qp, kp, vp)]
        engine.backward(_view(qp), _view(kp), _view(vp), _view(op), _view(d_out), _view(lsep),
                        _view(scratch[0]), _view(scratch[1]), _view(scratch[2]), 0, 0, stream)
        dkp += scratch[2]


    def _backward_in_user_layout(engine, q, k, v, out, lse, d_out, sinks=None, d_lse=None):
        """dQ, dK, dV in the caller's layout from the caller's Q, K, V, O, LSE and dO (the
        torch.library ops' backward, which save only the caller's tensors): with a layout
        exchange they go into the plan's layout first (one all-to-all more than the autograd
        function's backward, which saved the plan-layout shards). With sinks ([heads]) also
        dsinks, this rank's 1/P of the total as _AttentionFunction returns it (else None).
        d_lse: the LSE's gradient [batch, heads, local tokens] (every rank passes one or none;
        without sinks and softcap), added as _AttentionFunction adds it."""
        q, k, v, out, d_out = (_engine_ready(x) for x in (q, k, v, out, d_out.to(q.dtype)))
        lse = lse.to(torch.float32).contiguous()
        device, stream = q.device, _stream_of(q)
        if engine.exchanges:
            b, h, m = q.shape[0], q.shape[2], engine.plan_tokens
            qp, kp, vp, op, dop = (torch.empty((b, m) + tuple(x.shape[2:]), dtype=x.dtype,
                                               device=device)
                                   for x in (q, k, v, out, d_out))
            lsep = torch.empty((b, h, m), dtype=torch.float32, device=device)
            engine.exchange_in([(_view(x), _view(y)) for x, y in
                                ((q, qp), (k, kp), (v, vp), (out, op), (d_out, dop))],
                               [(_view(lse), _view(lsep))], True, stream)
        else:
            qp, kp, vp, op, dop, lsep = q, k, v, out, d_out, lse
        dqp, dkp, dvp = (torch.empty(x.shape, dtype=x.dtype, device=device)
                         for x in (qp, kp, vp))
        sink_values = dsink = None
        if sinks is not None:  # host arrays, as the autograd function's (backend.hpp)
            sink_values = sinks.detach().to("cpu", torch.float32).contiguous()
            dsink = torch.zeros(sink_values.shape, dtype=torch.float32)
        engine.backward(_view(qp), _view(kp), _view(vp), _view(op), _view(dop), _view(lsep),
                        _view(dqp), _view(dkp), _view(dvp),
                        0 if sinks is None else sink_values.data_ptr(),
                        0 if sinks is None else dsink.data_ptr(), stream=stream)
        if d_lse is not None:
            _add_lse_gradient(engine, d_lse, q.shape[1], qp, kp, vp, op, lsep, dqp, dkp)
        d_sinks = (None if sinks is None
                   else (dsink / engine.size).to(device=sinks.device, dtype=sinks.dtype))
        if not engine.exchanges:
            return dqp, dkp, dvp, d_sinks
        dq, dk, dv = (torch.empty(x.shape, dtype=x.dtype, device=device)
                      for x in (q, k, v))
        engine.exchange_out([(_view(dqp), _view(dq)), (_view(dkp), _view(dk)),
                             (_view(dvp), _view(dv))], [], True, stream)
        return dq, dk, dv, d_sinks
