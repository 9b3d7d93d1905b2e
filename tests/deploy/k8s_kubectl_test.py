"""deploy/k8s as kubectl sees it, offline: every file parses, the
kustomization lists every manifest and renders, kubectl decodes every object
into its typed API struct, and (with a kubectl that knows every field used)
no field is dropped on the way, i.e. none is misspelt or misplaced.

`kubectl create --dry-run=client` needs an API server even with
--validate=false (it maps kinds to resources through discovery), so it cannot
run here; `kubectl set ... --local` decodes the same objects with no server.

usage: k8s_kubectl_test.py K8S_DIR"""

import glob
import json
import os
import re
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_common as dc  # noqa: E402

# Fields the manifests use that older kubectls drop, with the minor version
# whose API has them: losing these to an older client is not a typo.
NEWER_FIELDS = {"grpc": 23, "completionMode": 21}
POD_TEMPLATE_KINDS = {"StatefulSet", "Job", "Deployment", "DaemonSet", "ReplicaSet", "Pod"}


def dropped(original, decoded, path=""):
    """Paths in `original` that `decoded` lost. kubectl adds defaults and the
    env var we set, so only losses count."""
    if isinstance(original, dict):
        out = []
        for k, v in original.items():
            if not isinstance(decoded, dict) or k not in decoded:
                out.append(f"{path}.{k}")
            else:
                out += dropped(v, decoded[k], f"{path}.{k}")
        return out
    if isinstance(original, list):
        if not isinstance(decoded, list) or len(decoded) < len(original):
            return [path]
        return [p for i, v in enumerate(original) for p in dropped(v, decoded[i], f"{path}[{i}]")]
    return []


def typed_decode(kubectl, obj):
    """Decodes `obj` into kubectl's typed struct and back. Returns
    (error, decoded or None): set env / set selector print what they decoded;
    other kinds only report whether they decoded."""
    kind = obj.get("kind")
    if kind in POD_TEMPLATE_KINDS:
        cmd = ["set", "env", "--local", "-f", "-", "ZO_KUBECTL_DECODE=1", "-o", "json"]
    elif kind == "Service" and obj.get("spec", {}).get("selector"):
        selector = ",".join(f"{k}={v}" for k, v in obj["spec"]["selector"].items())
        cmd = ["set", "selector", "--local", "-f", "-", selector, "-o", "json"]
    else:
        # Decodes into the typed struct first, then refuses every kind but a
        # Service: that refusal means the decode worked.
        cmd = ["set", "selector", "--local", "-f", "-", "zo-decode=1", "-o", "json"]
    r = subprocess.run([kubectl] + cmd, input=json.dumps(obj), capture_output=True, text=True,
                       errors="replace")
    if "selector" in cmd and "zo-decode=1" in cmd:
        ok = "only supported for Services" in r.stderr
        return (None if ok else r.stderr.strip() or "decoded although not a Service"), None
    if r.returncode != 0:
        return r.stderr.strip(), None
    return None, json.loads(r.stdout)


def main():
    k8s_dir = sys.argv[1]
    yaml = dc.import_yaml()
    kubectl = dc.kubectl_or_skip()
    minor = dc.kubectl_minor(kubectl)
    print(f"kubectl 1.{minor} at {kubectl}")
    f = dc.Failures()

    # Every file parses; every object names its kind; every manifest is listed.
    with open(os.path.join(k8s_dir, "kustomization.yaml")) as fh:
        kustomization = yaml.safe_load(fh)
    listed = set(kustomization.get("resources", []))
    for path in sorted(glob.glob(os.path.join(k8s_dir, "*.yaml"))):
        name = os.path.basename(path)
        try:
            with open(path) as fh:
                docs = [d for d in yaml.safe_load_all(fh) if d is not None]
        except yaml.YAMLError as e:
            f.check(False, f"{name} does not parse: {e}")
            continue
        if name == "kustomization.yaml":
            continue
        f.check(name in listed, f"{name} is not in kustomization.yaml's resources")
        for d in docs:
            f.check(isinstance(d, dict) and d.get("apiVersion") and d.get("kind")
                    and d.get("metadata", {}).get("name"),
                    f"{name}: an object without apiVersion, kind or metadata.name")
    for name in sorted(listed):
        f.check(os.path.exists(os.path.join(k8s_dir, name)),
                f"kustomization.yaml lists {name}, which does not exist")

    for obj in dc.render(k8s_dir, kubectl, yaml, f) or []:
        what = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        error, decoded = typed_decode(kubectl, obj)
        if not f.check(error is None, f"{what}: kubectl cannot decode it: {error}"):
            continue
        if decoded is None:
            print(f"{what}: decoded")
            continue
        lost, newer = [], []
        for p in dropped(obj, decoded):
            field = re.sub(r"\[\d+\]$", "", p).rsplit(".", 1)[-1]
            (newer if minor < NEWER_FIELDS.get(field, 0) else lost).append(p)
        for p in newer:
            print(f"note: {what}: kubectl 1.{minor} predates {p}; not checked")
        f.check(not lost, f"{what}: fields kubectl does not know (misspelt or misplaced): "
                + ", ".join(lost))
        if not lost:
            print(f"{what}: decoded, no field dropped")
    f.finish("deploy/k8s with kubectl")


if __name__ == "__main__":
    main()
