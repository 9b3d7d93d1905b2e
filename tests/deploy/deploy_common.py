"""What the deploy/ tests share: skipping, kubectl, rendering deploy/k8s,
quantities and the flags a binary's --help lists."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

SKIP = 77  # SKIP_RETURN_CODE in tests/deploy/CMakeLists.txt


def skip(why):
    print(f"SKIPPED: {why}")
    sys.exit(SKIP)


def import_yaml():
    try:
        import yaml
    except ImportError:
        skip("python3-yaml is not installed (bash deploy/install-deps.sh test brings it "
             "with python3-torch)")
    return yaml


class Failures:
    """Collects every failed check so one run names them all."""

    def __init__(self):
        self.messages = []

    def check(self, ok, message):
        if not ok:
            self.messages.append(message)
        return ok

    def finish(self, what):
        for m in self.messages:
            print(f"FAIL: {m}")
        if self.messages:
            print(f"{what}: {len(self.messages)} check(s) failed")
            sys.exit(1)
        print(f"{what}: all checks passed")


def kubectl_or_skip():
    path = shutil.which("kubectl")
    if path is None:
        skip("no kubectl on PATH (bash deploy/install-deps.sh test installs Debian's "
             "kubernetes-client)")
    return path


def kubectl_minor(kubectl):
    # Debian's 1.20 and newer clients all answer with clientVersion as JSON.
    out = subprocess.run([kubectl, "version", "--client", "-o", "json"],
                         capture_output=True, text=True, check=True).stdout
    minor = json.loads(out)["clientVersion"]["minor"]
    return int(re.match(r"\d+", minor).group())


def render(k8s_dir, kubectl, yaml, failures):
    """`kubectl kustomize` of a copy of k8s_dir, with a made-up auth token
    where the operator's is absent (it is never committed). Returns the
    rendered objects, or None after recording why it failed."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "k8s")
        shutil.copytree(k8s_dir, copy)
        token = os.path.join(copy, "auth-token")
        if not os.path.exists(token):
            with open(token, "w") as f:
                f.write("test-token\n")
        r = subprocess.run([kubectl, "kustomize", copy], capture_output=True, text=True,
                           errors="replace")
        if not failures.check(r.returncode == 0,
                              f"kubectl kustomize {k8s_dir}: {r.stderr.strip()}"):
            return None
    return [d for d in yaml.safe_load_all(r.stdout) if d is not None]


_SUFFIX = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity_bytes(text):
    """Bytes of a Kubernetes memory quantity or a zo size ("192Gi", "64G")."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]i?|k)?", str(text))
    if m is None:
        raise ValueError(f"not a byte quantity: {text!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2) or ""]


def help_flags(binary):
    """The --flags a zo binary's --help lists."""
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"^  --([a-z0-9_-]+) \(default", out, re.M))


def flags_in(text):
    """--flag names in a command line or script, dashes as written."""
    return set(re.findall(r"(?<![\w-])--([a-z][a-z0-9_-]*)", text))


def check_flags(failures, where, used, binary):
    known = {f.replace("_", "-") for f in help_flags(binary)}
    for flag in sorted(used):
        name = flag.replace("_", "-")
        if name in known:
            continue
        failures.check(False, f"{where}: --{flag} is not a flag of {binary}")
