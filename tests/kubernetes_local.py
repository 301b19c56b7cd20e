"""Runs `pstrain launch-lines --launcher=kubernetes`'s manifests without a
cluster (tests/kubernetes_test.sh).

1. Renders the coordinator's and the tasks' manifests and checks every
   object against the Kubernetes API's schema as Debian's python3-kubernetes
   (22.6, Kubernetes 1.22) models it: every key is a field of its object,
   every value has the field's type, required fields are present.
   (kubectl's client-side dry run needs the server's OpenAPI document, so it
   cannot check anything offline.)
2. Runs each container as a local process, as Kubernetes would: the
   Deployment's one pod and pod I = 0..completions-1 of each Indexed Job with
   JOB_COMPLETION_INDEX=I, the container's env, $(VAR) in its command
   expanded from that env, the image's /opt/pstrain/bin mapped to an
   installed copy, each Secret volume to the test's certificate folder and
   an emptyDir to a fresh one, and the Services' DNS names to 127.0.0.1
   (--coordinator=SERVICE:PORT becomes 127.0.0.1:PORT, --advertise=POD-DNS
   becomes 127.0.0.1, --bind=0.0.0.0 127.0.0.1, the PS's --port=7000 a free
   port: every pod has its own address on a cluster, here they share one).
3. The job has max_restarts: 2, so its Jobs restart containers in their
   pods (restartPolicy OnFailure, PSTRAIN_SELF_RESTART=1). Mid-training the
   test SIGKILLs worker 1's process and starts its command again with the
   same env, as the kubelet would; the new process reports its own restart
   to the coordinator (restart 1 of 2) and rejoins. (The max_restarts: 0
   manifests, restartPolicy Never and backoffLimit 0, are rendered and
   checked, not run.)
4. The job must end SUCCEEDED (`pstrain wait`) and every process still
   running exit 0.

Usage: python3 kubernetes_local.py BIN_DIR   (BIN_DIR: Bazel's bazel-bin)
Prints PASS, SKIP: reason, or FAIL: reason (exit 1).
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

DATA = "/usr/share/datasets/fashion-mnist"
IMAGE_BIN = "/opt/pstrain/bin"


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# --- Schema -----------------------------------------------------------------

def check_object(models, value, type_name, path, errors):
    """Checks `value` (parsed YAML) against python3-kubernetes' type
    `type_name` ('V1Job', 'list[V1Container]', 'dict(str, str)', 'str')."""
    if type_name.startswith("list["):
        if not isinstance(value, list):
            errors.append("%s: expected a list" % path)
            return
        for i, item in enumerate(value):
            check_object(models, item, type_name[5:-1], "%s[%d]" % (path, i),
                         errors)
        return
    if type_name.startswith("dict("):
        if not isinstance(value, dict):
            errors.append("%s: expected a map" % path)
            return
        inner = type_name[5:-1].split(", ", 1)[1]
        for key, item in value.items():
            check_object(models, item, inner, "%s.%s" % (path, key), errors)
        return
    scalars = {"str": (str,), "int": (int,), "bool": (bool,),
               "float": (int, float), "object": (object,)}
    if type_name in scalars:
        if not isinstance(value, scalars[type_name]) or (
                type_name == "int" and isinstance(value, bool)):
            errors.append("%s: expected %s, got %r" % (path, type_name, value))
        return
    cls = getattr(models, type_name)
    if not isinstance(value, dict):
        errors.append("%s: expected a %s object" % (path, type_name))
        return
    by_json = {json: attr for attr, json in cls.attribute_map.items()}
    for key, item in value.items():
        if key not in by_json:
            errors.append("%s: unknown field %r of %s" % (path, key, type_name))
            continue
        check_object(models, item, cls.openapi_types[by_json[key]],
                     "%s.%s" % (path, key), errors)


def check_schema(documents):
    try:
        import kubernetes.client as kc
    except ImportError:
        fail("python3-kubernetes is not installed (scripts/setup.sh)")
    kinds = {("v1", "Service"): "V1Service", ("batch/v1", "Job"): "V1Job",
             ("apps/v1", "Deployment"): "V1Deployment"}
    api = kc.ApiClient()
    # The check is not vacuous: a misspelt field is caught.
    errors = []
    check_object(kc.models, {"spec": {"completionMod": "Indexed"}}, "V1Job",
                 "self-check", errors)
    if not errors:
        fail("schema: the check missed an unknown field")
    for doc in documents:
        key = (doc.get("apiVersion"), doc.get("kind"))
        if key not in kinds:
            fail("unexpected object %r" % (key,))
        errors = []
        where = "%s %s" % (doc["kind"], doc["metadata"]["name"])
        check_object(kc.models, doc, kinds[key], where, errors)
        if errors:
            fail("schema: " + "; ".join(errors))

        # The models' own checks: required fields and enumerations.
        class Response:
            data = __import__("json").dumps(doc)
        try:
            api.deserialize(Response(), kinds[key])
        except (ValueError, TypeError) as e:
            fail("schema: %s: %s" % (where, e))
    print("schema: %d objects match python3-kubernetes %s's models" %
          (len(documents), __import__("kubernetes").__version__))


# --- Local pods ---------------------------------------------------------------

def pod_process(pod_spec, env_extra, secrets, install_bin, tmp, log_path):
    """Starts the pod's one container as a local process."""
    (container,) = pod_spec["containers"]
    env = dict(os.environ)
    for name in ("PSTRAIN_TLS_DIR", "PSTRAIN_ADMIN_TLS_DIR", "SLURM_PROCID",
                 "OMPI_COMM_WORLD_RANK", "PMI_RANK", "JOB_COMPLETION_INDEX"):
        env.pop(name, None)
    paths = {}
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "secret" in volume:
            paths[mount["mountPath"]] = secrets[volume["secret"]["secretName"]]
            if not mount.get("readOnly"):
                fail("Secret %s is not mounted read-only" % mount["name"])
        else:
            paths[mount["mountPath"]] = tempfile.mkdtemp(dir=tmp)
    paths[IMAGE_BIN] = install_bin

    def mapped(text):
        for image_path, local in paths.items():
            text = text.replace(image_path, local)
        return text

    pod_env = {}
    for item in container.get("env", []):
        pod_env[item["name"]] = mapped(item["value"])
    pod_env.update(env_extra)
    env.update(pod_env)
    argv = []
    for arg in container["command"]:
        # Kubernetes expands $(VAR) from the container's environment.
        arg = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                     lambda m: pod_env.get(m.group(1), m.group(0)), arg)
        arg = mapped(arg)
        if arg.startswith("--coordinator="):
            arg = "--coordinator=127.0.0.1:" + arg.rsplit(":", 1)[1]
        elif arg.startswith("--advertise="):
            arg = "--advertise=127.0.0.1"
        elif arg == "--bind=0.0.0.0":
            arg = "--bind=127.0.0.1"
        elif arg.startswith("--port=") and "pstrain_ps" in argv[0]:
            arg = "--port=%d" % free_port()
        argv.append(arg)
    log = open(log_path, "w")
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)


def main():
    bin_dir = os.path.abspath(sys.argv[1])
    pstrain = os.path.join(bin_dir, "cli/pstrain")
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        print("SKIP: dataset-fashion-mnist is not installed")
        return
    try:
        import yaml
    except ImportError:
        fail("python3-yaml is not installed (scripts/setup.sh)")
    tmp = tempfile.mkdtemp(prefix="pstrain-k8s-")
    processes = []
    try:
        def run(*args, **kwargs):
            return subprocess.run(list(args), capture_output=True, text=True,
                                   **kwargs)

        # The image's binaries, and the folders the Secrets would hold.
        r = run(pstrain, "install", "--prefix=" + tmp + "/opt")
        if r.returncode != 0:
            fail("pstrain install: " + r.stderr)
        admin, nodes = tmp + "/admin", tmp + "/nodes"
        r = run(pstrain, "certs", "--out=" + admin, "--nodes_out=" + nodes,
                "--num_ps=2", "--num_workers=2")
        if r.returncode != 0:
            fail("pstrain certs: " + r.stderr)
        coordinator_secret = tmp + "/coordinator-secret"
        os.mkdir(coordinator_secret)
        for name in ("ca.pem", "coordinator.pem", "coordinator.key"):
            shutil.copy(os.path.join(admin, name), coordinator_secret)
        secrets = {"pstrain-tls": nodes,
                   "pstrain-coordinator-tls": coordinator_secret}
        spec = tmp + "/job.pbtxt"
        with open(spec, "w") as f:
            f.write('model: "lenet5" dataset: "fashion_mnist" mode: "sync"\n'
                    "num_ps: 2 num_workers: 2 batch_size: 64 epochs: 1\n"
                    "max_steps_per_epoch: 400 log_every_steps: 20\n"
                    "max_restarts: 2\n")
        port = free_port()
        common = [pstrain, "launch-lines", spec, "--launcher=kubernetes",
                  "--image=registry.example/pstrain:test",
                  "--coordinator=pstrain-coordinator:%d" % port]

        def render(*extra):
            r = run(*(common + list(extra)))
            if r.returncode != 0:
                fail("launch-lines %s: %s" % (" ".join(extra), r.stderr))
            return [d for d in yaml.safe_load_all(r.stdout) if d]

        coordinator_docs = render("--k8s_objects=coordinator")
        check_schema(coordinator_docs)
        (deployment,) = [d for d in coordinator_docs
                         if d["kind"] == "Deployment"]
        processes.append(("coordinator", pod_process(
            deployment["spec"]["template"]["spec"], {}, secrets,
            tmp + "/opt/bin", tmp, tmp + "/coordinator.log")))
        env = dict(os.environ, PSTRAIN_ADMIN_TLS_DIR=admin)
        env.pop("PSTRAIN_TLS_DIR", None)
        coordinator = "--coordinator=127.0.0.1:%d" % port
        deadline = time.time() + 20
        while True:
            r = run(pstrain, "submit", spec, coordinator, env=env)
            if r.returncode == 0:
                break
            if time.time() > deadline or processes[0][1].poll() is not None:
                fail("submit: %s\n%s" % (r.stderr, open(
                    tmp + "/coordinator.log").read()))
            time.sleep(0.3)
        job = r.stdout.strip()
        # Without restarts: each task runs once.
        once = tmp + "/once.pbtxt"
        with open(once, "w") as f:
            f.write(open(spec).read().replace("max_restarts: 2", ""))
        r = run(*([pstrain, "launch-lines", once] + common[3:] +
                  ["--job=" + job]))
        if r.returncode != 0:
            fail("launch-lines max_restarts 0: " + r.stderr)
        for j in yaml.safe_load_all(r.stdout):
            if j and j["kind"] == "Job" and (
                    j["spec"]["backoffLimit"] != 0 or
                    j["spec"]["template"]["spec"]["restartPolicy"] != "Never"
                    or "PSTRAIN_SELF_RESTART" in r.stdout):
                fail("max_restarts 0: expected restartPolicy Never, "
                     "backoffLimit 0, no PSTRAIN_SELF_RESTART")
        task_docs = render("--job=" + job, "--cpus_per_task=1",
                           "--memory_per_task=1Gi")
        check_schema(task_docs)
        jobs = [d for d in task_docs if d["kind"] == "Job"]
        services = {d["metadata"]["name"] for d in task_docs
                    if d["kind"] == "Service"}
        if len(jobs) != 2 or services != {j["metadata"]["name"] for j in jobs}:
            fail("expected an Indexed Job and a headless Service per role")
        for j in jobs:
            pod = j["spec"]["template"]["spec"]
            if (j["spec"]["completionMode"] != "Indexed" or
                    pod["subdomain"] != j["metadata"]["name"] or
                    pod["restartPolicy"] != "OnFailure"):
                fail("%s: not an Indexed Job of its Service's pods that "
                     "restarts containers" % j["metadata"]["name"])
            # Every task of the Job may restart max_restarts times.
            if j["spec"]["backoffLimit"] != 2 * j["spec"]["completions"]:
                fail("%s: backoffLimit %d, expected 2 x %d" % (
                    j["metadata"]["name"], j["spec"]["backoffLimit"],
                    j["spec"]["completions"]))
            (container,) = pod["containers"]
            if {"name": "PSTRAIN_SELF_RESTART", "value": "1"} not in \
                    container["env"]:
                fail("%s: PSTRAIN_SELF_RESTART=1 is not set" %
                     j["metadata"]["name"])
            if j["metadata"]["name"].endswith("-worker"):
                worker_pod = pod
            for i in range(j["spec"]["completions"]):
                name = "%s-%d" % (j["metadata"]["name"], i)
                processes.append((name, pod_process(
                    pod, {"JOB_COMPLETION_INDEX": str(i)}, secrets,
                    tmp + "/opt/bin", tmp, "%s/%s.log" % (tmp, name))))
        # Mid-training (worker 0 has logged a step), SIGKILL worker 1's
        # process; the kubelet starts the container's command again in the
        # same pod: same env, same JOB_COMPLETION_INDEX.
        names = [name for name, _ in processes]
        victim = len(processes) - 1  # the worker Job's index 1
        deadline = time.time() + 30
        chief_log = "%s/%s.log" % (tmp, names[-2])
        while not re.search(r"[Ss]tep ?\d+", open(chief_log).read()):
            if time.time() > deadline or processes[victim][1].poll() is not None:
                fail("no training step logged before the kill: %s\n%s" % (
                    open(chief_log).read()[-2000:], open(
                        "%s/%s.log" % (tmp, names[-1])).read()[-2000:]))
            time.sleep(0.1)
        processes[victim][1].kill()
        if processes[victim][1].wait() != -9:
            fail("worker 1 ended before it was killed")
        restarted_log = "%s/%s.restarted.log" % (tmp, names[-1])
        processes[victim] = (names[-1], pod_process(
            worker_pod, {"JOB_COMPLETION_INDEX": "1"}, secrets,
            tmp + "/opt/bin", tmp, restarted_log))
        print("killed %s mid-training (SIGKILL) and started it again" %
              names[-1])
        r = run(pstrain, "wait", job, coordinator, env=env, timeout=120)
        print(r.stdout[-1500:], end="")
        if "SUCCEEDED" not in r.stdout + r.stderr or r.returncode != 0:
            fail("pstrain wait %s exited %d: %s" % (job, r.returncode,
                                                    r.stderr[-2000:]))
        for name, p in processes[1:]:
            try:
                code = p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                fail("pod %s still runs after its job ended" % name)
            if code != 0:
                fail("pod %s exited %d: %s" % (name, code, open(
                    "%s/%s.log" % (tmp, name)).read()[-2000:]))
        if "restart 1 of 2" not in open(restarted_log).read():
            fail("the restarted worker did not report its restart: " +
                 open(restarted_log).read()[-2000:])
        r = run(pstrain, "logs", job, coordinator, env=env, timeout=30)
        if "restart 1 of 2" not in r.stdout:
            fail("the job's log has no restart: " + r.stdout[-2000:])
        for line in r.stdout.splitlines() + open(
                restarted_log).read().splitlines()[:3]:
            if "restart" in line:
                print(line)
        print("PASS: job %s SUCCEEDED after worker 1's container restarted "
              "(restart 1 of 2); %d pods exited 0" % (job, len(processes) - 1))
    finally:
        for _, p in processes:
            if p.poll() is None:
                p.terminate()
        for _, p in processes:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
