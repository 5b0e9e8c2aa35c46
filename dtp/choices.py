"""The values the command line shows before it imports torch: one torch-free home for each.

`dtp --help` must answer in well under a second, so the parsers (`tools/commands.py`) import only
the standard library and this module. Each value below is defined here once; the torch-side modules
that use it (`policy`, `analysis.check`, `analysis.verify`, `quant.schemes`, `fit.hardware`, ...) import
it from here rather than keeping a copy. Tables keyed by these names (`policy.DTYPES`, `quant.SCHEMES`,
`fit.hardware.HARDWARE`, `analysis.released.RELEASED_PIPELINES`, `families.pipelines.CHECKPOINTS`) stay
in their homes, with the keys this module names.
"""

from __future__ import annotations

CP_MODES = ("ulysses", "ring")  # context-parallel attention: all-to-all over heads, or K/V passed around
DTYPE_NAMES = ("fp32", "float32", "bf16", "bfloat16", "fp16", "float16")  # short and long forms
CHECK_DTYPES = ("fp32", "bf16", "fp16")  # `dtp check --dtype`
RELEASED_PIPELINES = (
    "flux-pipeline",
    "flux2-pipeline",
    "qwenimage-pipeline",
    "wan-pipeline",
    "wan-vace-pipeline",
    "ltx2-pipeline",
    "hunyuanvideo15-pipeline",
    "flux3-pipeline",
)  # full-size component configs
DEMO_MODELS = ("flux", "qwenimage")  # the tiny pipeline checkpoints `dtp demo` writes
DEFAULT_TIMEOUT_S = 600  # a collective's wait: torch's gloo default is 30 min, NCCL's watchdog 10; one value here
DEFAULT_TOL = 1e-5  # fp32: the house parity bound for a whole tiny model (`dtp verify`)
QUANT_SCHEMES = ("fp8wo", "int8wo")  # `dtp check`: the weight-only schemes (fp8 needs a GPU to quantize)
CACHE_NAMES = (
    "fbc",
    "taylorseer",
    "pab",
    "faster",
    "mag",
    "sea",
)  # the step caches `dtp run --cache` names (dtp.cache)
FIT_CACHE_NAMES = ("taylorseer", "pab")  # caches whose state `dtp fit --cache` models (dtp/fit/cache_state.py)
RUN_QUANT_SCHEMES = ("fp8", "fp8wo", "int8wo")  # every torchao scheme `dtp run --quant` loads
ATTENTION_BACKENDS = ("auto", "flash", "efficient", "cudnn", "math")  # torch's SDPA kernels; diffusers' names too
FIT_TABLE_ROWS = 20  # `dtp fit` rows printed without --all
HARDWARE_NAMES = ("H100 SXM", "H200", "A100 80GB", "L40S", "L20", "RTX 4090", "B200", "GB200")  # `dtp fit --hardware`
INTER_NODE_NAMES = ("400Gb IB", "800Gb IB", "8x200Gb RoCE", "100GbE", "NVL72")  # `dtp fit --inter-node` presets
DEFAULT_TEXT_TOKENS = 512  # T5 / Mistral / Qwen2.5-VL prompt length the pipelines pad or cap to
COMPILE_BACKENDS = ("inductor", "eager", "aot_eager")  # `compile=` / `dtp run --compile [BACKEND]` (dynamo backends)
SDPA_BACKENDS = ("auto", "flash", "efficient", "cudnn", "math")  # torch SDPA's kernels: dtp's short backend names
DIFFUSERS_BACKENDS = (
    "flash",
    "flash_hub",
    "flash_varlen",
    "flash_varlen_hub",
    "flash_4_hub",
    "_flash_3",
    "_flash_varlen_3",
    "_flash_3_hub",
    "_flash_3_varlen_hub",
    "aiter_fa2_hub",
    "flex",
    "native",
    "_native_cudnn",
    "_native_efficient",
    "_native_flash",
    "_native_math",
    "_native_npu",
    "_native_xla",
    "sage",
    "sage_hub",
    "sage_blackwell_hub",
    "sage_varlen",
    "_sage_qk_int8_pv_fp8_cuda",
    "_sage_qk_int8_pv_fp8_cuda_sm90",
    "_sage_qk_int8_pv_fp16_cuda",
    "_sage_qk_int8_pv_fp16_triton",
    "xformers",
)  # diffusers 0.42.1's `AttentionBackendName` values (a unit test keeps this equal to the installed diffusers')
# `attention_backend=` / `--attention-backend`: the short names first (torch's SDPA kernels: "flash" is torch's
# built-in flash kernel, i.e. diffusers' "_native_flash"), then diffusers' own names; diffusers' "flash" (the
# flash-attn package) is shadowed by the short name (its hub build is "flash_hub").
ATTENTION_BACKENDS = SDPA_BACKENDS + tuple(name for name in DIFFUSERS_BACKENDS if name not in SDPA_BACKENDS)
