"""deploy/systemd/zo-server.service and zo-server.env: the unit's content
(restart, hardening, limits, stop), the flags it passes from the environment
file, and `systemd-analyze verify` / `security` on it.

usage: systemd_unit_test.py SYSTEMD_DIR ZO_SERVER_BINARY"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_common as dc  # noqa: E402

INSTALLED_BINARY = "/usr/local/bin/zo-server"
INSTALLED_ENV = "/etc/zo/zo-server.env"
# The most exposure `systemd-analyze security` may report (0 best, 10 worst).
MAX_EXPOSURE = 2.0


def parse_unit(text):
    """{section: [(key, value)]}, continuation lines joined, comments dropped."""
    sections, section, pending = {}, None, ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            sections.setdefault(section, [])
            continue
        key, _, value = line.partition("=")
        sections[section].append((key.strip(), value.strip()))
    return sections


def values(sections, section, key):
    return [v for k, v in sections.get(section, []) if k == key]


def last(sections, section, key):
    v = values(sections, section, key)
    return v[-1] if v else None


def parse_env(text):
    env = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


def seconds(text):
    m = re.fullmatch(r"(\d+)\s*(s|min)?", text or "")
    return None if m is None else int(m.group(1)) * (60 if m.group(2) == "min" else 1)


def under(path, roots):
    return any(os.path.commonpath([path, r]) == r for r in roots)


def main():
    systemd_dir, binary = sys.argv[1], sys.argv[2]
    unit_path = os.path.join(systemd_dir, "zo-server.service")
    env_path = os.path.join(systemd_dir, "zo-server.env")
    unit_text = open(unit_path).read()
    env = parse_env(open(env_path).read())
    unit = parse_unit(unit_text)
    f = dc.Failures()

    # Restart, user, stop.
    f.check(last(unit, "Service", "Restart") == "on-failure", "Restart= is not on-failure")
    user = last(unit, "Service", "User")
    f.check(user not in (None, "root", "0"), f"User= is {user!r}: it must be a dedicated user")
    f.check(last(unit, "Service", "KillSignal") in (None, "SIGTERM"),
            "KillSignal= is not SIGTERM, zo-server's graceful stop")
    stop = seconds(last(unit, "Service", "TimeoutStopSec"))
    f.check(stop is not None and stop > 5,
            "TimeoutStopSec= must exceed the 5 s zo-server gives in-flight calls on SIGTERM")
    f.check(last(unit, "Service", "LimitMEMLOCK") == "infinity",
            "LimitMEMLOCK= is not infinity (pinned and io_uring registered buffers)")

    # Hardening that fits a server writing swap files and checkpoints.
    for key, want in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"),
                      ("ProtectHome", "yes"), ("PrivateTmp", "yes"),
                      ("PrivateDevices", "yes"), ("ProtectKernelTunables", "yes"),
                      ("ProtectKernelModules", "yes"), ("ProtectControlGroups", "yes"),
                      ("RestrictSUIDSGID", "yes"), ("LockPersonality", "yes"),
                      ("CapabilityBoundingSet", "")]:
        got = last(unit, "Service", key)
        f.check(got == want, f"{key}= is {got!r}, want {want!r}")
    filters = " ".join(values(unit, "Service", "SystemCallFilter"))
    f.check("@system-service" in filters or "@aio" in filters or "io_uring_setup" in filters,
            "SystemCallFilter= must allow io_uring (@aio, part of @system-service)")

    # The paths zo-server writes must be writable under ProtectSystem=strict,
    # and their mounts up before it starts.
    writable = " ".join(values(unit, "Service", "ReadWritePaths")).split()
    writable = [p.lstrip("-") for p in writable]
    mounts = " ".join(values(unit, "Unit", "RequiresMountsFor")).split()
    for var in ("ZO_NVME_PATH", "ZO_CHECKPOINT_DIR"):
        path = env.get(var, "")
        f.check(path.startswith("/"), f"{var}={path!r} in zo-server.env is not an absolute path")
        if path.startswith("/"):
            f.check(under(path, writable),
                    f"{var}={path} is not under ReadWritePaths= {writable}: read-only for the service")
            f.check(under(path, mounts), f"{var}={path} is not under RequiresMountsFor= {mounts}")
    token = env.get("ZO_AUTH_TOKEN_FILE", "")
    f.check(token != "", "ZO_AUTH_TOKEN_FILE is empty: the tier would run without auth")
    f.check(not token.startswith(("/home/", "/root/", "/tmp/")),
            f"ZO_AUTH_TOKEN_FILE={token} is hidden by ProtectHome=/PrivateTmp=")
    listen = env.get("ZO_LISTEN", "")
    f.check(not listen.startswith(("127.", "localhost", "[::1]")),
            f"ZO_LISTEN={listen} is loopback: workers on other hosts cannot connect")

    # ExecStart: zo-server, fed by every variable of the environment file.
    f.check(values(unit, "Service", "EnvironmentFile") == [INSTALLED_ENV],
            f"EnvironmentFile= is not {INSTALLED_ENV}")
    exec_start = last(unit, "Service", "ExecStart") or ""
    argv = shlex.split(exec_start)
    f.check(argv[:1] == [INSTALLED_BINARY], f"ExecStart= does not run {INSTALLED_BINARY}")
    used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", exec_start))
    for var in sorted(used - env.keys()):
        f.check(False, f"ExecStart= uses ${var}, which zo-server.env does not define")
    for var in sorted(env.keys() - used):
        f.check(False, f"zo-server.env defines {var}, which ExecStart= never passes")
    dc.check_flags(f, "ExecStart=", dc.flags_in(exec_start) | dc.flags_in(env.get("ZO_EXTRA_FLAGS", "")),
                   binary)

    # systemd-analyze on the real file; only the binary and environment file
    # paths point into this tree (verify wants the binary to exist).
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        f.finish("systemd unit (static checks)")
        dc.skip("systemd-analyze not found (Debian's systemd; bash deploy/install-deps.sh test)")
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "zo-server.service")
        text = unit_text.replace(f"ExecStart={INSTALLED_BINARY} ",
                                 f"ExecStart={os.path.abspath(binary)} ")
        text = text.replace(f"EnvironmentFile={INSTALLED_ENV}\n",
                            f"EnvironmentFile={os.path.abspath(env_path)}\n")
        changed = [(a, b) for a, b in zip(unit_text.splitlines(), text.splitlines()) if a != b]
        f.check(len(changed) == 2, f"the verified copy differs in {len(changed)} lines, not 2")
        with open(copy, "w") as out:
            out.write(text)
        r = subprocess.run([analyze, "verify", "--man=no", copy], capture_output=True, text=True)
        f.check(r.returncode == 0 and not r.stderr.strip(),
                f"systemd-analyze verify: rc {r.returncode}: {r.stderr.strip()}")
        r = subprocess.run([analyze, "security", "--offline=yes", copy],
                           capture_output=True, text=True)
        m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout)
        if r.returncode != 0 and "offline" in r.stderr:
            print("note: this systemd-analyze has no --offline: exposure not measured")
        elif f.check(m is not None, f"systemd-analyze security: {r.stderr.strip()}"):
            exposure = float(m.group(1))
            print(f"systemd-analyze security: exposure {exposure}")
            f.check(exposure <= MAX_EXPOSURE,
                    f"systemd-analyze security: exposure {exposure} > {MAX_EXPOSURE}")
    f.finish("systemd unit")


if __name__ == "__main__":
    main()
