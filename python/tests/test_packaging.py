"""`pip install .` for real: the repository installed into a venv, then zo
used from outside the source and build trees (another working directory,
no PYTHONPATH) as a user would: its version, its commands, and a few
OffloadOptimizer steps beside torch.optim.AdamW.

deploy/pip-check.sh runs this with ZO_PIP_VENV naming the venv to install
into (one on Debian's python with python3-torch, one on a PyPI python with
PyPI's torch); without it (ctest's run over python/tests) it skips.
"""

import json
import os
import re
import subprocess
import sys

import pytest

VENV = os.environ.get("ZO_PIP_VENV", "")
pytestmark = pytest.mark.skipif(not VENV, reason="ZO_PIP_VENV names no venv "
                                "(deploy/pip-check.sh runs this test)")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def user_env(venv_bin):
    """The environment of a user who activated the venv: its bin first on
    PATH, nothing of the build tree."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "ZO_SERVER_PATH", "ZO_CTL_PATH", "ZO_PIP_VENV")}
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = os.path.dirname(venv_bin)
    env["OMP_NUM_THREADS"] = "1"
    return env


@pytest.fixture(scope="module")
def venv_bin(tmp_path_factory):
    """The venv's bin/, with the repository pip-installed into it (the CMake
    build directory of pyproject.toml is reused, so a second install only
    recompiles what changed)."""
    venv_bin = os.path.join(os.path.abspath(VENV), "bin")
    cwd = tmp_path_factory.mktemp("pip")
    done = subprocess.run([os.path.join(venv_bin, "python"), "-m", "pip", "install", ROOT],
                          cwd=cwd, env=user_env(venv_bin), capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, f"pip install {ROOT} failed:\n{done.stdout}\n{done.stderr}"
    return venv_bin


def run_python(venv_bin, cwd, code):
    done = subprocess.run([os.path.join(venv_bin, "python"), "-c", code], cwd=cwd,
                          env=user_env(venv_bin), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{code}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_imports_the_installed_package_with_its_version(venv_bin, tmp_path):
    out = run_python(venv_bin, tmp_path, """if True:
        import importlib.metadata, json, os, zo, zo._native, zo.torch
        here = os.path.dirname(zo.__file__)
        print(json.dumps({"version": zo.__version__,
                          "dist_version": importlib.metadata.version("zo"),
                          "package": here, "native": zo._native.__file__,
                          "files": sorted(os.listdir(here))}))""")
    got = json.loads(out.strip().splitlines()[-1])
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        version = re.search(r"project\(zo VERSION ([0-9.]+)", f.read()).group(1)
    assert got["version"] == version and got["dist_version"] == version
    site = os.path.realpath(os.path.abspath(VENV))
    for path in (got["package"], got["native"]):
        assert os.path.realpath(path).startswith(site + os.sep), f"{path} is not in {VENV}"
    for name in ("__init__.py", "torch.py", "_version.py", "_native.pyi", "py.typed"):
        assert name in got["files"]


@pytest.mark.parametrize("command,usage", [("zo-server", "usage: zo-server"),
                                           ("zo-ctl", "usage: zo-ctl")])
def test_the_commands_are_in_the_venvs_bin(venv_bin, tmp_path, command, usage):
    path = os.path.join(venv_bin, command)
    assert os.access(path, os.X_OK), f"{path} is missing"
    done = subprocess.run([command, "--help"], cwd=tmp_path, env=user_env(venv_bin),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert usage in done.stdout + done.stderr


STEPS = """if True:
    import copy, re, subprocess, sys, threading
    import torch, zo.torch

    def model_and_reference():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
        return model, copy.deepcopy(model)

    def check(servers):
        cfg = {"train_batch_size": 1,
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}}
        model, ref = model_and_reference()
        opt = zo.torch.OffloadOptimizer(model.named_parameters(), config=cfg, servers=servers)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.01)
        for step in range(3):
            g = torch.Generator().manual_seed(step)
            x, y = torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g)
            torch.nn.functional.mse_loss(model(x), y).backward()
            for p, q in zip(model.parameters(), ref.parameters()):
                q.grad = p.grad.clone()
            opt.step(); ref_opt.step(); opt.zero_grad(); ref_opt.zero_grad()
        opt.close()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=2e-5, atol=1e-6)
        return sum(p.numel() for p in model.parameters())

    n = check(None)  # an embedded server
    # zo-server as the venv's command
    server = subprocess.Popen(["zo-server", "--listen", "127.0.0.1:0", "--threads", "1"],
                              stderr=subprocess.PIPE, text=True)
    try:
        for line in server.stderr:
            m = re.search(r"listening on 127\\.0\\.0\\.1:0 \\(port (\\d+)\\)", line)
            if m:
                break
        else:
            sys.exit(f"zo-server exited with {server.wait()} before listening")
        threading.Thread(target=lambda: all(True for _ in server.stderr), daemon=True).start()
        check([f"127.0.0.1:{m.group(1)}"])
    finally:
        server.kill()
        server.wait()
    print(f"torch {torch.__version__}: {n} parameters as AdamW's, embedded and on zo-server")
"""


def test_offload_optimizer_steps_as_adamw(venv_bin, tmp_path):
    out = run_python(venv_bin, tmp_path, STEPS)
    print(out.strip())
    assert "as AdamW's" in out


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
