# SPDX-License-Identifier: Apache-2.0
"""Small CUDA kernels for the benchmarks' ceilings and floors, compiled at run
time with NVRTC and launched through the driver API on torch's current stream
(so a graph captured on that stream records them). No build step, no PyTorch
extension: only libnvrtc and libcuda, found as the benchmarks find them.

    module = NvrtcModule(SOURCE, ("kernel_a", "kernel_b"))
    module.launch("kernel_a", (blocks_x, blocks_y), threads, [ctypes.c_void_p(ptr), ctypes.c_int(n)])

compile_image() needs no GPU and no torch: the source can be checked for the
card's architecture on a machine without one. Modules stay loaded until the
process ends (a benchmark loads a few).
"""

import ctypes
import glob
import os


def nvrtc_candidates():
    """Where libnvrtc may be: beside torch's CUDA libraries (the nvidia-* wheels), the loader's path, the toolkit."""
    found = []
    try:
        import torch

        site = os.path.dirname(os.path.dirname(torch.__file__))
        for pattern in ("nvidia/cu*/lib/libnvrtc.so*", "nvidia/cuda_nvrtc/lib/libnvrtc.so*"):
            found += sorted(glob.glob(os.path.join(site, pattern)), reverse=True)
    except ImportError:
        pass
    found += ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"]
    for home in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        for sub in ("lib64", "lib"):
            if home:
                found += sorted(glob.glob(os.path.join(home, sub, "libnvrtc.so*")), reverse=True)
    unique = []
    for name in found:
        if name not in unique:
            unique.append(name)
    return unique


def _compile(nvrtc, source, filename, arch, cubin):
    program = ctypes.c_void_p()
    status = nvrtc.nvrtcCreateProgram(ctypes.byref(program), source.encode(), filename.encode(), 0, None, None)
    if status:
        raise RuntimeError(f"nvrtcCreateProgram: {status}")
    try:
        options = [f"--gpu-architecture={arch}".encode(), b"--std=c++17"]
        status = nvrtc.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*options))
        if status:
            size = ctypes.c_size_t()
            nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
            text = ctypes.create_string_buffer(size.value + 1)
            nvrtc.nvrtcGetProgramLog(program, text)
            raise RuntimeError(f"{arch}: {text.value.decode(errors='replace').strip()[:400]}")
        size = ctypes.c_size_t()
        get_size, get = (
            (nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN) if cubin else (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
        )
        if get_size(program, ctypes.byref(size)) or size.value == 0:
            raise RuntimeError(f"{arch}: no {'cubin' if cubin else 'PTX'}")
        image = ctypes.create_string_buffer(size.value)
        if get(program, image):
            raise RuntimeError(f"{arch}: {'cubin' if cubin else 'PTX'} not returned")
        return image.raw
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(program))


def _newest_known_below(nvrtc, major, minor):
    """The newest architecture this NVRTC compiles for that is not newer than
    the device's (the driver JIT-compiles its PTX), or None."""
    try:
        count = ctypes.c_int()
        if nvrtc.nvrtcGetNumSupportedArchs(ctypes.byref(count)) or count.value <= 0:
            return None
        archs = (ctypes.c_int * count.value)()
        if nvrtc.nvrtcGetSupportedArchs(archs):
            return None
    except AttributeError:  # an NVRTC before 11.2
        return None
    known = [a for a in archs if a <= major * 10 + minor]
    return max(known) if known else None


def compile_image(source, filename, major, minor):
    """(image, libnvrtc used): a cubin for sm_<major><minor>; if this NVRTC
    does not know the architecture, PTX for the newest one it knows below it."""
    errors = []
    for name in nvrtc_candidates():
        try:
            nvrtc = ctypes.CDLL(name)
        except OSError:
            continue
        try:
            return _compile(nvrtc, source, filename, f"sm_{major}{minor}", True), name
        except (RuntimeError, AttributeError) as error:
            errors.append(f"{name}: {error}")
        older = _newest_known_below(nvrtc, major, minor)
        if older is not None:
            try:
                return _compile(nvrtc, source, filename, f"compute_{older}", False), name
            except (RuntimeError, AttributeError) as error:
                errors.append(f"{name}: {error}")
    raise RuntimeError("no usable libnvrtc" + (": " + "; ".join(errors) if errors else " found"))


class NvrtcModule:
    """`source` compiled for the current GPU and loaded in torch's context; `names` are its extern "C" kernels."""

    def __init__(self, source, names, filename="kernels.cu"):
        import torch

        torch.zeros(1, device="cuda")  # the runtime's primary context, current on this thread
        major, minor = torch.cuda.get_device_capability()
        image, self.nvrtc_path = compile_image(source, filename, major, minor)
        cuda = self.cuda = ctypes.CDLL("libcuda.so.1")
        cuda.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        self.check(cuda.cuInit(0), "cuInit")
        context = ctypes.c_void_p()
        self.check(cuda.cuCtxGetCurrent(ctypes.byref(context)), "cuCtxGetCurrent")
        if not context.value:
            device = ctypes.c_int()
            self.check(cuda.cuDeviceGet(ctypes.byref(device), torch.cuda.current_device()), "cuDeviceGet")
            self.check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
            self.check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
        self.module = ctypes.c_void_p()
        self._image = ctypes.create_string_buffer(image)
        self.check(cuda.cuModuleLoadData(ctypes.byref(self.module), self._image), "cuModuleLoadData")
        self.functions = {}
        for name in names:
            function = ctypes.c_void_p()
            self.check(cuda.cuModuleGetFunction(ctypes.byref(function), self.module, name.encode()), name)
            self.functions[name] = function

    def check(self, status, what):
        if status:
            text = ctypes.c_char_p()
            self.cuda.cuGetErrorString(status, ctypes.byref(text))
            raise RuntimeError(f"{what}: CUDA error {status} ({(text.value or b'').decode()})")

    @staticmethod
    def arguments(values):
        """The kernel-parameter array cuLaunchKernel takes for ctypes values (keep `values` alive while it is used)."""
        return (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])

    def launch(self, name, grid, threads, params):
        """One launch on torch's current stream; grid an int or (x, y); params from arguments()."""
        import torch

        x, y = (grid, 1) if isinstance(grid, int) else grid
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self.check(
            self.cuda.cuLaunchKernel(self.functions[name], x, y, 1, threads, 1, 1, 0, stream, params, None),
            f"{name}<<<({x}, {y}), {threads}>>>",
        )
