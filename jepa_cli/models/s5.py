"""Bidirectional S5 token mixer (Smith, Warrington & Linderman, "Simplified State Space Layers for
Sequence Modeling", ICLR 2023; their JAX code lindermanlab/S5, s5/ssm.py and s5/ssm_init.py).

One multi-input multi-output linear recurrence per direction over a sequence u [L, H]:

    x_k = Lambda_bar * x_{k-1} + B_bar u_k        (forward; backward runs from the end)
    y_k = 2 Re(C_f x^f_k + C_b x^b_k) + D * u_k

- diagonal complex state: Lambda = the eigenvalues of the normal part of HiPPO-LegS (HiPPO-N; S5
  Sec. 4.1 and ssm_init.make_DPLR_HiPPO), B and C initialised in its eigenbasis V;
- conjugate symmetry (S5 Sec. 4.3, conj_sym): of the P eigenvalues, which come in conjugate pairs,
  only P/2 are stored and the output takes 2 Re(.);
- zero-order hold (S5 eq. 6): Lambda_bar = exp(Lambda * step), B_bar = (Lambda_bar - 1) / Lambda * B,
  with a learned log step per state, initialised log-uniform in `step` (option `ssm_step`; default
  [1e-3, 1e-1], S5's dt_min, dt_max);
- `jax.lax.associative_scan` over (Lambda_bar, B_bar u) pairs (S5 Sec. 3.2), both directions;
- bidirectional as S5's `bidirectional`: the two states are concatenated and projected by one C of
  twice the state width (here C_f and C_b, the halves of that C);
- the state and its scan run in float32 (complex64) whatever the compute dtype.

Padding: where `valid` is False the step is the identity (Lambda_bar = 1, input 0), so the state
passes over padded slots unchanged and the valid tokens see exactly the recurrence on the valid
subsequence, in either direction. Their own outputs are meaningless, and masked downstream.

Gaps (option `ssm_gaps`): a masked context is a subsequence of the scan. `skip` runs the recurrence on
that shorter sequence, so the tokens on either side of a hole are one step apart. `elapse` takes each
token's place in the whole scan (`times`) and decays the state by Lambda_bar^g across a gap of g places,
with the one-step B_bar: the outputs are exactly those of the whole sequence with the masked tokens'
inputs set to zero (the hidden inputs zeroed, nothing else). This is not S5's variable-step hold (Sec. 6.3,
lindermanlab/S5 `ssm.py`), which also rescales the input, B_bar = Lambda^-1 (Lambda_bar^g - I) B, at
each step of length g.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jepa_cli.models.layers import gelu, linear_layer
from jepa_cli.models.mixer_pattern import SSM_STEP

# The S5 leaves kept out of weight decay: S5's "standard" optimiser groups (train_helpers.py
# create_train_state: B, Lambda_re, Lambda_im and log_step go to plain Adam, C and D to AdamW). Decay
# would pull the eigenvalues' real parts and the log steps towards 0, i.e. towards marginal stability
# and unit steps. C is decayed as any matrix; D, the eigenvalues and the log steps, vectors, are not (the
# JEPA codes' groups leave every 1-D leaf out), so B [P, H, 2] is the one leaf to name.
NO_DECAY = ("b",)
LAMBDA_RE_MAX = -1e-4  # S5 clip_eigs: real parts stay below 0, so |Lambda_bar| < 1


def hippo_n(p: int) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues complex [p] and eigenvectors complex [p, p] of the normal part of HiPPO-LegS of
    order p (S5 ssm_init.make_DPLR_HiPPO): S = A + r r^T with A the LegS matrix and r_n = sqrt(n + 1/2);
    S + 1/2 I is skew-symmetric, so every eigenvalue has real part -1/2. Eigenvalues come in
    conjugate pairs, ordered by imaginary part (the first p/2 have negative imaginary parts)."""
    n = np.arange(p, dtype=np.float64)
    q = np.sqrt(1.0 + 2.0 * n)
    legs = -(np.tril(q[:, None] * q[None, :]) - np.diag(n))  # HiPPO-LegS A (Gu et al. 2020, eq. 4)
    r = np.sqrt(n + 0.5)
    normal = legs + r[:, None] * r[None, :]
    real = np.mean(np.diag(normal)) * np.ones(p)  # -1/2 on the diagonal
    imag, vectors = np.linalg.eigh(normal * -1j)  # S - diag(real) is skew-symmetric: -iS is Hermitian
    return real + 1j * imag, vectors


def _combine(left, right):
    """The associative operator of a diagonal linear recurrence: (a_l, b_l) then (a_r, b_r) is
    (a_r a_l, a_r b_l + b_r) (S5 Sec. 3.2, binary_operator)."""
    a_l, b_l = left
    a_r, b_r = right
    return a_r * a_l, a_r * b_l + b_r


def linear_scan(lambda_bar, bu, valid=None, reverse: bool = False):
    """States x [B, L, N] of x_k = lambda_bar_k * x_{k-1} + bu_k from x_0 = 0 (reverse: from the end,
    x_k = lambda_bar_k * x_{k+1} + bu_k). lambda_bar [N] (one per state) or [B, L, N] (one per step)
    complex, bu [B, L, N] complex, valid bool [B, L] (None: all valid): an invalid step is the
    identity, so it neither adds nor decays."""
    a = jnp.broadcast_to(lambda_bar, bu.shape)
    if valid is not None:
        a = jnp.where(valid[..., None], a, jnp.ones((), a.dtype))
        bu = jnp.where(valid[..., None], bu, jnp.zeros((), bu.dtype))
    _, states = jax.lax.associative_scan(_combine, (a, bu), reverse=reverse, axis=1)
    return states


def _lecun_normal(key, shape, fan_in: int):
    """flax lecun_normal: truncated normal (at +-2 std) of variance 1 / fan_in."""
    std = np.sqrt(1.0 / fan_in) / 0.87962566103423978  # flax's truncated-normal std correction
    return jax.random.truncated_normal(key, -2.0, 2.0, shape, jnp.float32) * std


class S5(nnx.Module):
    """The bidirectional S5 SSM: u [B, L, H] (valid [B, L]) -> y [B, L, H] float32.

    Parameters (float32): lambda_re, lambda_im, log_step [P/2]; b [P/2, H, 2] (B_tilde = V^-1 B,
    real and imaginary parts); c [2, H, P/2, 2] (C_tilde = C V for the forward and backward states);
    d [H]. Initialisation as S5's defaults (ssm.py: B lecun_normal, C trunc_standard_normal, D
    normal(1))."""

    def __init__(self, width: int, state: int, rngs: nnx.Rngs, step: tuple[float, float] = SSM_STEP):
        half = state // 2
        eigenvalues, vectors = hippo_n(state)
        lam = eigenvalues[:half]
        v = vectors[:, :half]  # [P, P/2]: the eigenvectors of the kept eigenvalues
        v_inv = v.conj().T  # [P/2, P]
        self.lambda_re = nnx.Param(jnp.asarray(lam.real, jnp.float32))
        self.lambda_im = nnx.Param(jnp.asarray(lam.imag, jnp.float32))
        b = _lecun_normal(rngs.params(), (state, width), state)  # S5: lecun_normal on (P, H)
        vb = jnp.einsum("qp,ph->qh", jnp.asarray(v_inv, jnp.complex64), b.astype(jnp.complex64))
        self.b = nnx.Param(jnp.stack([vb.real, vb.imag], axis=-1))
        # S5 trunc_standard_normal: each row of C ~ lecun_normal over (1, P, 2), fan-in P
        c = _lecun_normal(rngs.params(), (2, width, state, 2), state)
        cv = jnp.einsum("fhp,pq->fhq", c[..., 0] + 1j * c[..., 1], jnp.asarray(v, jnp.complex64))
        self.c = nnx.Param(jnp.stack([cv.real, cv.imag], axis=-1))
        self.d = nnx.Param(jax.random.normal(rngs.params(), (width,), jnp.float32))
        self.log_step = nnx.Param(jax.random.uniform(rngs.params(), (half,), jnp.float32,
                                                     np.log(step[0]), np.log(step[1])))

    def eigenvalues(self):
        """(Lambda, Lambda * step) complex [P/2]: the continuous eigenvalues, real parts clipped below 0,
        and the exponent of one zero-order-hold step."""
        lam = jnp.minimum(self.lambda_re[...], LAMBDA_RE_MAX) + 1j * self.lambda_im[...]
        return lam, lam * jnp.exp(self.log_step[...])

    def discretize(self):
        """ZOH: (Lambda_bar, B_bar) complex [P/2], [P/2, H] (S5 eq. 6, ssm.discretize_zoh)."""
        lam, exponent = self.eigenvalues()
        lambda_bar = jnp.exp(exponent)
        b = self.b[..., 0] + 1j * self.b[..., 1]
        return lambda_bar, ((lambda_bar - 1.0) / lam)[:, None] * b

    def gap_decays(self, times):
        """Lambda_bar^g for the gaps g between consecutive scan places: (forward, backward) complex
        [B, L, P/2] from times int [B, L] (increasing along L over the valid tokens). Forward step k
        decays by the gap from token k-1 to k, backward step k by the gap from k to k+1; the first
        forward and last backward step start from a zero state, so their gap is irrelevant (1)."""
        _, exponent = self.eigenvalues()
        gaps = jnp.diff(times, axis=1).astype(self.lambda_re.dtype)  # [B, L-1]
        ones = jnp.ones_like(gaps[:, :1])
        forward = jnp.concatenate([ones, gaps], axis=1)
        backward = jnp.concatenate([gaps, ones], axis=1)
        return (jnp.exp(exponent * forward[..., None]), jnp.exp(exponent * backward[..., None]))

    def __call__(self, u, valid=None, times=None):
        """times int [B, L]: each token's place in the whole scan (option `ssm_gaps` elapse); None
        steps once per token."""
        dtype = jnp.promote_types(self.lambda_re.dtype, jnp.float32)  # float32, or float64 under x64
        u = u.astype(dtype)
        lambda_bar, b_bar = self.discretize()
        bu = (jnp.einsum("blh,ph->blp", u, b_bar.real) + 1j * jnp.einsum("blh,ph->blp", u, b_bar.imag))
        forward_decay = backward_decay = lambda_bar
        if times is not None:
            forward_decay, backward_decay = self.gap_decays(times)
        forward = linear_scan(forward_decay, bu, valid)
        backward = linear_scan(backward_decay, bu, valid, reverse=True)
        c = self.c[...]
        y = sum(jnp.einsum("blp,hp->blh", x.real, c[i, ..., 0]) - jnp.einsum("blp,hp->blh", x.imag, c[i, ..., 1])
                for i, x in enumerate((forward, backward)))
        return 2.0 * y + self.d[...] * u


class S5Mixer(nnx.Module):
    """The mixer of an S5 block, in the place of attention: x [B, L, D] -> [B, L, D] in the compute
    dtype. S5 SSM, GELU (S5's `gelu` activation), then an output Linear (`proj`, as attention's) so
    that adaLN-Zero and the residual see a projection like attention's."""

    def __init__(self, dim: int, state: int, dtype, rngs: nnx.Rngs, step: tuple[float, float] = SSM_STEP):
        self.dtype = dtype
        self.ssm = S5(dim, state, rngs, step)
        self.proj = linear_layer(dim, dim, dtype, rngs)

    def __call__(self, x, valid=None, times=None):
        return self.proj(gelu(self.ssm(x, valid, times)).astype(self.dtype))
