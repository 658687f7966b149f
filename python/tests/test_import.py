"""`import dsa` imports no framework and never touches CUDA."""
import os
import subprocess
import sys

PROBE = r"""
import sys
import dsa
assert 'torch' not in sys.modules, 'import dsa imported torch'
assert 'cupy' not in sys.modules, 'import dsa imported cupy'
with open('/proc/self/maps') as f:
    maps = f.read()
# CUDA builds link the runtime statically; it loads libcuda only when first called.
assert 'libcuda.so' not in maps, 'import dsa loaded libcuda'
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
                          "assert 'libcuda.so' not in open('/proc/self/maps').read()\nprint(")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_cuda_available_without_gpus_is_false():
    r = subprocess.run([sys.executable, "-c", "import dsa; print(dsa.cuda_available())"],
                       env=dict(os.environ, CUDA_VISIBLE_DEVICES=""), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
