"""deploy/k8s agrees with itself and with the binaries, as rendered by
`kubectl kustomize`: the headless Service selects the StatefulSet's pods,
probes and Prometheus annotations name declared ports, every volume, Secret
and ConfigMap referenced exists, the flags' paths lie on the right volumes,
the workers' --servers list is the StatefulSet's stable names, and the
worker script, run for every index with a stand-in zo-train, gives every
(stage, dp rank) once with addresses that point at the right pods.

usage: k8s_consistency_test.py K8S_DIR ZO_SERVER_BINARY ZO_TRAIN_BINARY"""

import json
import os
import re
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_common as dc  # noqa: E402

STATEFULSET = "zo-server"
JOB = "zo-train"


def by_kind(objects, kind):
    return {o["metadata"]["name"]: o for o in objects if o.get("kind") == kind}


def flag_values(args):
    """{flag: value} of --flag=value arguments."""
    out = {}
    for a in args:
        m = re.fullmatch(r"--([a-z0-9_-]+)=(.*)", a)
        if m:
            out[m.group(1).replace("_", "-")] = m.group(2)
    return out


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def mount_for(container, path):
    """The volumeMount whose mountPath holds `path`, or None."""
    best = None
    for m in container.get("volumeMounts", []):
        root = m["mountPath"].rstrip("/")
        if path == root or path.startswith(root + "/"):
            if best is None or len(root) > len(best["mountPath"]):
                best = m
    return best


def check_references(f, what, pod_spec, claim_templates, objects):
    """Every mount names a volume; every volume's ConfigMap, Secret or claim
    exists in the rendered objects."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    for c in pod_spec["containers"]:
        for m in c.get("volumeMounts", []):
            f.check(m["name"] in volumes or m["name"] in claim_templates,
                    f"{what}: mount {m['mountPath']} names volume {m['name']}, which is not declared")
    for v in volumes.values():
        if "configMap" in v:
            f.check(v["configMap"]["name"] in by_kind(objects, "ConfigMap"),
                    f"{what}: volume {v['name']} names ConfigMap {v['configMap']['name']}, which does not exist")
        if "secret" in v:
            f.check(v["secret"]["secretName"] in by_kind(objects, "Secret"),
                    f"{what}: volume {v['name']} names Secret {v['secret']['secretName']}, which does not exist")
        if "persistentVolumeClaim" in v:
            f.check(v["persistentVolumeClaim"]["claimName"] in by_kind(objects, "PersistentVolumeClaim"),
                    f"{what}: volume {v['name']} names claim {v['persistentVolumeClaim']['claimName']}, "
                    "which does not exist")
    return volumes


def file_on(f, what, flag, path, container, volumes, objects, kind):
    """`path` is a key of the ConfigMap or Secret mounted where it points.
    Returns that object or None."""
    m = mount_for(container, path)
    if not f.check(m is not None, f"{what}: {flag}={path} is on no mounted volume"):
        return None
    v = volumes.get(m["name"], {})
    field, name_key = ("configMap", "name") if kind == "ConfigMap" else ("secret", "secretName")
    if not f.check(field in v, f"{what}: {flag}={path} is on volume {m['name']}, not a {kind}"):
        return None
    obj = by_kind(objects, kind).get(v[field][name_key])
    key = path[len(m["mountPath"].rstrip("/")) + 1:]
    f.check(obj is not None and key in obj.get("data", {}),
            f"{what}: {flag}={path}: {kind} {v[field][name_key]} has no key {key!r}")
    return obj


def check_servers(f, objects, server_binary):
    sts = by_kind(objects, "StatefulSet").get(STATEFULSET)
    if not f.check(sts is not None, f"no StatefulSet {STATEFULSET}"):
        return None
    what = f"StatefulSet/{STATEFULSET}"
    spec, pod = sts["spec"], sts["spec"]["template"]
    labels = pod["metadata"].get("labels", {})
    f.check(selects(spec["selector"].get("matchLabels"), labels),
            f"{what}: selector does not match its pod template's labels")

    # The headless Service behind it.
    svc = by_kind(objects, "Service").get(spec.get("serviceName"))
    if f.check(svc is not None, f"{what}: serviceName {spec.get('serviceName')!r} names no Service"):
        f.check(svc["spec"].get("clusterIP") == "None",
                f"Service/{svc['metadata']['name']} is not headless (clusterIP: None)")
        f.check(selects(svc["spec"].get("selector"), labels),
                f"Service/{svc['metadata']['name']} selector does not match the {what} pods")

    c = pod["spec"]["containers"][0]
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    if svc is not None:
        for p in svc["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            f.check(target in ports or target in ports.values(),
                    f"Service/{svc['metadata']['name']} port {p['port']} targets {target!r}, "
                    "which the pods do not declare")
        f.check({"grpc", "metrics"} <= {p.get("name") for p in svc["spec"]["ports"]},
                f"Service/{svc['metadata']['name']} lacks a port named grpc or metrics")

    args = c.get("command", []) + c.get("args", [])
    flags = flag_values(args)
    dc.check_flags(f, what, dc.flags_in(" ".join(args)), server_binary)

    # Ports: gRPC on every interface at the port named grpc, which all probes use.
    listen = flags.get("listen", "127.0.0.1:7070")
    f.check(listen.startswith("0.0.0.0:") or listen.startswith("[::]:"),
            f"{what}: --listen={listen} is not every interface: probes and peers cannot reach it")
    f.check(ports.get("grpc") == port_of(listen),
            f"{what}: --listen port {port_of(listen)} is not the container port named grpc {ports.get('grpc')}")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        p = c.get(probe)
        if probe == "startupProbe" and p is None:
            continue
        if f.check(p is not None and "grpc" in p, f"{what}: {probe} is not a grpc probe"):
            f.check(p["grpc"]["port"] == ports.get("grpc"),
                    f"{what}: {probe} port {p['grpc']['port']} is not the container port named grpc")

    # Metrics: the flag, the port named metrics and the scrape annotations agree.
    notes = pod["metadata"].get("annotations", {})
    metrics = flags.get("metrics-listen")
    if f.check(metrics is not None, f"{what}: no --metrics-listen"):
        f.check(ports.get("metrics") == port_of(metrics),
                f"{what}: --metrics-listen port is not the container port named metrics")
    f.check(notes.get("prometheus.io/scrape") == "true", f"{what}: no prometheus.io/scrape: \"true\"")
    f.check(notes.get("prometheus.io/port") == str(ports.get("metrics")),
            f"{what}: prometheus.io/port {notes.get('prometheus.io/port')} is not the metrics port")

    # Volumes: swap on a per-pod claim, checkpoints on a shared one, the token
    # from a Secret key.
    templates = {t["metadata"]["name"]: t for t in spec.get("volumeClaimTemplates", [])}
    volumes = check_references(f, what, pod["spec"], templates, objects)
    nvme = mount_for(c, flags.get("nvme-path", "-"))
    f.check(nvme is not None and nvme["name"] in templates,
            f"{what}: --nvme-path={flags.get('nvme-path')} is not on a volumeClaimTemplate volume")
    ckpt = mount_for(c, flags.get("checkpoint-dir", "-"))
    claim = volumes.get(ckpt["name"], {}).get("persistentVolumeClaim", {}).get("claimName") if ckpt else None
    pvc = by_kind(objects, "PersistentVolumeClaim").get(claim)
    f.check(pvc is not None and "ReadWriteMany" in pvc["spec"].get("accessModes", []),
            f"{what}: --checkpoint-dir={flags.get('checkpoint-dir')} is not on a ReadWriteMany claim "
            "(every server of a job writes there)")
    secret = file_on(f, what, "--auth-token-file", flags.get("auth-token-file", ""), c, volumes,
                     objects, "Secret")

    # The memory budget fits in the limit, with room for gradients and buffers.
    limit = c.get("resources", {}).get("limits", {}).get("memory")
    budget = flags.get("memory-budget")
    if f.check(limit is not None and budget, f"{what}: needs a memory limit and --memory-budget"):
        f.check(dc.quantity_bytes(budget) < dc.quantity_bytes(limit),
                f"{what}: --memory-budget={budget} does not fit in the memory limit {limit}")
    return {"sts": sts, "svc": svc, "grpc_port": ports.get("grpc"), "secret": secret}


def run_worker_script(c, env, index):
    """Runs the worker container's command for one index with a zo-train that
    prints its arguments. Returns {flag: value}."""
    with tempfile.TemporaryDirectory() as tmp:
        stub = os.path.join(tmp, "zo-train")
        with open(stub, "w") as fh:
            fh.write('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
        os.chmod(stub, 0o755)
        run_env = dict(env, JOB_COMPLETION_INDEX=str(index), PATH=f"{tmp}:/usr/bin:/bin")
        argv = c["command"] + c.get("args", [])
        r = subprocess.run(argv, env=run_env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"index {index}: rc {r.returncode}: {r.stderr.strip()}")
    return flag_values(r.stdout.splitlines())


def check_workers(f, objects, servers, train_binary):
    job = by_kind(objects, "Job").get(JOB)
    if not f.check(job is not None, f"no Job {JOB}"):
        return
    what = f"Job/{JOB}"
    spec, pod = job["spec"], job["spec"]["template"]
    c = pod["spec"]["containers"][0]
    ns = job["metadata"].get("namespace", "default")
    env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
    f.check(spec.get("completionMode") == "Indexed", f"{what}: completionMode is not Indexed")
    f.check(int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0)) >= 1,
            f"{what}: requests no nvidia.com/gpu")
    dc.check_flags(f, what, dc.flags_in(" ".join(c["command"] + c.get("args", [])))
                   | dc.flags_in(env.get("ZO_TRAIN_ARGS", "")), train_binary)
    volumes = check_references(f, what, pod["spec"], {}, objects)

    # The workers' names: a headless Service of the Job's subdomain.
    sub = pod["spec"].get("subdomain")
    svc = by_kind(objects, "Service").get(sub)
    if f.check(svc is not None, f"{what}: subdomain {sub!r} names no Service"):
        f.check(svc["spec"].get("clusterIP") == "None", f"Service/{sub} is not headless")
        f.check(selects(svc["spec"].get("selector"), pod["metadata"].get("labels", {})),
                f"Service/{sub} selector does not match the {what} pods")
    stage_ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}

    stages = int(env.get("ZO_PIPELINE_STAGES", 0))
    ranks = int(env.get("ZO_DP_WORLD_SIZE", 0))
    f.check(spec.get("completions") == stages * ranks,
            f"{what}: completions {spec.get('completions')} is not ZO_PIPELINE_STAGES x "
            f"ZO_DP_WORLD_SIZE = {stages * ranks}")
    f.check(spec.get("parallelism") == spec.get("completions"),
            f"{what}: parallelism is not completions: a pipeline needs every stage at once")

    # The servers: the StatefulSet's stable names, in order, all of them.
    if servers is not None:
        sts, sts_svc = servers["sts"], servers["svc"]
        want = [f"{sts['metadata']['name']}-{i}.{sts['spec']['serviceName']}."
                f"{sts['metadata'].get('namespace', 'default')}.svc:{servers['grpc_port']}"
                for i in range(sts["spec"].get("replicas", 1))]
        got = env.get("ZO_SERVERS", "").split(",")
        f.check(got == want, f"{what}: ZO_SERVERS is {','.join(got)}; the StatefulSet's "
                f"pods are {','.join(want)}")
        f.check(sts_svc is None or ns == sts_svc["metadata"].get("namespace", "default"),
                f"{what}: runs in namespace {ns}, not the servers'")

    # The worker script for every index, with the downward API's values.
    run_env = dict(env, POD_NAMESPACE=ns)
    seen = {}
    for index in range(spec.get("completions") or 0):
        try:
            flags = run_worker_script(c, run_env, index)
        except RuntimeError as e:
            f.check(False, f"{what}: the worker script fails: {e}")
            return
        where = f"{what} index {index}"
        stage, rank = int(flags.get("stage", -1)), int(flags.get("dp-rank", -1))
        seen.setdefault((stage, rank), []).append(index)
        f.check(flags.get("pipeline-stages") == str(stages) and flags.get("dp-world-size") == str(ranks),
                f"{where}: --pipeline-stages/--dp-world-size are not {stages}/{ranks}")
        f.check(flags.get("servers") == env.get("ZO_SERVERS"), f"{where}: --servers is not ZO_SERVERS")
        addrs = flags.get("stage-addresses", "").split(",")
        f.check(len(addrs) == stages, f"{where}: {len(addrs)} stage addresses for {stages} stages")
        for s, a in enumerate(addrs):
            peer = rank * stages + s
            want = (f"*:{stage_ports.get('stage')}" if s == stage else
                    f"{JOB}-{peer}.{sub}.{ns}.svc:{stage_ports.get('stage')}")
            f.check(a == want, f"{where}: stage {s}'s address is {a}, want {want} (pod {peer})")
        file_on(f, where, "--config", flags.get("config", ""), c, volumes, objects, "ConfigMap")
        secret = file_on(f, where, "--auth-token-file", flags.get("auth-token-file", ""), c, volumes,
                         objects, "Secret")
        if servers is not None and secret is not None:
            f.check(secret is servers["secret"], f"{where}: its token is not the servers' Secret")
    want = {(s, r) for s in range(stages) for r in range(ranks)}
    f.check(set(seen) == want and all(len(v) == 1 for v in seen.values()),
            f"{what}: (stage, dp rank) per index is {seen}, want each of {sorted(want)} once")

    for cm in by_kind(objects, "ConfigMap").values():
        for key, text in cm.get("data", {}).items():
            if key.endswith(".json"):
                try:
                    json.loads(text)
                except ValueError as e:
                    f.check(False, f"ConfigMap/{cm['metadata']['name']}: {key} is not JSON: {e}")


def main():
    k8s_dir, server_binary, train_binary = sys.argv[1:4]
    yaml = dc.import_yaml()
    kubectl = dc.kubectl_or_skip()
    f = dc.Failures()
    objects = dc.render(k8s_dir, kubectl, yaml, f)
    if objects is None:
        f.finish("deploy/k8s consistency")
    servers = check_servers(f, objects, server_binary)
    check_workers(f, objects, servers, train_binary)
    f.finish("deploy/k8s consistency")


if __name__ == "__main__":
    main()
