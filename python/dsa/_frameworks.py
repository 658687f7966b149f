"""Which array framework an argument comes from, and how to allocate in it.

Detection never imports a framework: an object can only be a torch tensor if torch is
already in sys.modules, and so on. numpy is imported lazily, on the first CPU allocation.
"""
import contextlib
import sys

_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13


def framework_of(x):
    """'numpy', 'torch', 'cupy', 'dlpack' (any other DLPack producer) or None."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        return "numpy"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return "torch"
    cp = sys.modules.get("cupy")
    if cp is not None and isinstance(x, cp.ndarray):
        return "cupy"
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        return "dlpack"
    return None


def dtype_name(x):
    """'float32', 'bfloat16', 'uint8', ... whatever the framework calls it, without 'torch.'."""
    return str(getattr(x, "dtype", "")).replace("torch.", "")


def _stream_handle(stream):
    if isinstance(stream, bool):
        raise TypeError("stream: expected a CUDA stream handle, got bool")
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    raise TypeError(
        "stream: expected an int (cudaStream_t), a torch.cuda.Stream or a cupy.cuda.Stream, got "
        + type(stream).__name__)


class Context:
    """Where one call runs: the framework and device of its leading tensor argument."""

    def __init__(self, op, like, name, stream=None):
        self.op = op
        self.fw = framework_of(like)
        if like is None:
            raise ValueError("%s: %s: is required" % (op, name))
        if self.fw is None:
            raise TypeError("%s: %s: expected an array or tensor (numpy, torch, CuPy or any DLPack "
                            "producer), got %s" % (op, name, type(like).__name__))
        self.like = like
        self.cuda = False
        self.index = 0
        if self.fw == "torch":
            self.cuda = like.device.type == "cuda"
            self.index = (like.device.index or 0) if self.cuda else 0
        elif self.fw == "cupy":
            self.cuda = True
            self.index = like.device.id
        elif self.fw == "dlpack":
            dev_type, dev_id = like.__dlpack_device__()
            self.cuda = int(dev_type) in (_DL_CUDA, _DL_CUDA_MANAGED)
            self.index = int(dev_id) if self.cuda else 0
        self.stream = self._resolve_stream(stream)

    def _resolve_stream(self, stream):
        if not self.cuda:
            return 0  # CPU work is synchronous; a stream argument is ignored
        if stream is not None:
            return _stream_handle(stream)
        if self.fw == "torch":
            torch = sys.modules["torch"]
            return torch.cuda.current_stream(self.like.device).cuda_stream
        if self.fw == "cupy":
            return sys.modules["cupy"].cuda.get_current_stream().ptr
        return 0  # legacy default stream

    def device_guard(self):
        """Makes the tensors' GPU current for the launch (multi-GPU processes)."""
        if not self.cuda:
            return contextlib.nullcontext()
        if self.fw == "torch":
            torch = sys.modules["torch"]
            if torch.cuda.current_device() != self.index:
                return torch.cuda.device(self.index)
        elif self.fw == "cupy":
            return sys.modules["cupy"].cuda.Device(self.index)
        return contextlib.nullcontext()

    # -- allocation -------------------------------------------------------------------
    def empty(self, shape, kind, rep=None):
        """A new array in the call's framework and device.

        kind: 'f32', 'bf16', 'e4m3', 'i32', 'i64', 'u8'. Frameworks without bf16/fp8 get the
        bits as uint16/uint8. rep: an input whose numpy dtype (e.g. ml_dtypes.bfloat16) should
        be reused for bf16/e4m3 outputs.
        """
        shape = tuple(int(s) for s in shape)
        if self.fw == "torch":
            torch = sys.modules["torch"]
            dt = {"f32": torch.float32, "bf16": torch.bfloat16, "i32": torch.int32,
                  "i64": torch.int64, "u8": torch.uint8,
                  "e4m3": getattr(torch, "float8_e4m3fn", torch.uint8)}[kind]
            return torch.empty(shape, dtype=dt, device=self.like.device)
        if self.fw == "cupy":
            cp = sys.modules["cupy"]
            with cp.cuda.Device(self.index):
                return cp.empty(shape, dtype=_numpy_kind(kind))
        if self.cuda:
            raise TypeError("%s: out: no allocator for CUDA arrays of type %s; pass the output "
                            "arrays (out=, ...) yourself" % (self.op, type(self.like).__name__))
        import numpy as np
        dt = _numpy_kind(kind)
        if rep is not None and framework_of(rep) == "numpy":
            if (kind, rep.dtype.name) in (("bf16", "bfloat16"), ("e4m3", "float8_e4m3fn")):
                dt = rep.dtype
        return np.empty(shape, dtype=dt)

    def workspace_allocator(self):
        return lambda nbytes: self.empty((nbytes,), "u8")

    # -- export -----------------------------------------------------------------------
    def prep(self, x):
        """What the extension imports for x: torch tensors detached (DLPack refuses tensors that
        require grad) and float8_e4m3fn viewed as its uint8 bits (read back as e4m3)."""
        if x is None:
            return None
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(x, torch.Tensor):
            if x.requires_grad:
                x = x.detach()
            if x.dtype == getattr(torch, "float8_e4m3fn", None):
                x = x.view(torch.uint8)
        return x


def _numpy_kind(kind):
    import numpy as np
    return {"f32": np.float32, "bf16": np.uint16, "e4m3": np.uint8, "i32": np.int32,
            "i64": np.int64, "u8": np.uint8}[kind]
