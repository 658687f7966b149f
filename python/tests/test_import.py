"""`import dsa` imports no framework and never initialises the CUDA driver."""
import os
import subprocess
import sys

PROBE = r"""
import sys
import dsa
assert 'torch' not in sys.modules, 'import dsa imported torch'
assert 'cupy' not in sys.modules, 'import dsa imported cupy'
import os
# The CUDA driver is never initialised: initialisation opens /dev/nvidiactl and the device files.
# (libcuda itself may be mapped: cuBLAS's loader dlopens it when the library loads, without
# initialising it, which is fork-safe; the runtime is linked statically and starts on first use.)
def _driver_files():
    out = []
    for fd in os.listdir('/proc/self/fd'):
        try:
            t = os.readlink('/proc/self/fd/' + fd)
        except OSError:
            continue
        if t.startswith('/dev/nvidia'):
            out.append(t)
    with open('/proc/self/maps') as f:
        out += [l.split()[-1] for l in f if '/dev/nvidia' in l]
    return out
assert not _driver_files(), 'import dsa initialised the CUDA driver: %s' % _driver_files()
print('ok', dsa.__version__, dsa.compiled_backends())
"""


def _run(env_extra):
    env = dict(os.environ)
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)


def test_import_loads_no_framework_and_no_cuda_driver():
    r = _run({})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok")


def test_import_without_visible_gpus():
    r = _run({"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr


def test_cpu_calls_do_not_touch_cuda():
    probe = PROBE.replace("print(", "import numpy as np\n"
                          "dsa.topk(np.zeros((1, 10), np.float32), np.full(1, 10, np.int32), 64)\n"
                          "assert not _driver_files(), _driver_files()\nprint(")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_cuda_available_without_gpus_is_false():
    r = subprocess.run([sys.executable, "-c", "import dsa; print(dsa.cuda_available())"],
                       env=dict(os.environ, CUDA_VISIBLE_DEVICES=""), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
