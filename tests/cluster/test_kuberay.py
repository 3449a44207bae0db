"""KubeRay manifests from the project's configs: every one passes KubeRay v1.7.0's strict schema and the
operator's rules, bad ones are refused naming the field, and Ray's own KubeRay code reads them back."""

import copy
import os

import pytest
import yaml
from conftest import REPO

from scaleforge.cluster import load_cluster_config
from scaleforge.cluster.kuberay import cluster_manifest, dump, job_manifest, service_manifest
from scaleforge.cluster.kuberay_check import CRD_ENV, ManifestError, check_manifest, crd_folder
from scaleforge.config.loader import ConfigError, job_of

IMAGE, STORAGE = "ghcr.io/example/scaleforge:1", "s3://bucket/scaleforge"
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
PATHS = {  # configs without a storage root: where their shared files go
    "calibrate.yaml": ("serve_config=s3://bucket/scaleforge/serve.yaml",),
    "calibrate_lm.yaml": ("serve_config=s3://bucket/scaleforge/serve_lm.yaml",),
    "hwbench.yaml": ("output=s3://bucket/scaleforge/hwbench.json",),
}
GOLDEN = REPO / "tests" / "cluster" / "golden"
needs_crds = pytest.mark.skipif(
    crd_folder() is None, reason=f"KubeRay's CRDs not found: set {CRD_ENV} (../shared/kuberay/v1.7.0)"
)


def manifest_of(path):
    if job_of(path) == "jobs.serve":
        return service_manifest(str(path), IMAGE, STORAGE)
    return job_manifest(str(path), IMAGE, STORAGE, PATHS.get(path.name, ()))


@needs_crds
@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_config_becomes_a_manifest_the_operators_strict_schema_accepts(path):
    manifest = manifest_of(path)
    assert manifest["kind"] == ("RayService" if job_of(path) == "jobs.serve" else "RayJob")
    cluster = manifest["spec"].get("rayClusterSpec") or manifest["spec"]["rayClusterConfig"]
    assert cluster["authOptions"] == {"mode": "token"}
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # no work on the head
    assert check_manifest(copy.deepcopy(manifest)) == manifest


@needs_crds
@pytest.mark.parametrize(
    "name, make",
    [
        ("rayjob_train_dp.yaml", lambda: job_manifest(str(REPO / "configs/train_dp.yaml"), IMAGE, STORAGE)),
        ("rayservice_serve.yaml", lambda: service_manifest(str(REPO / "configs/serve.yaml"), IMAGE, STORAGE)),
        ("raycluster.yaml", lambda: cluster_manifest(str(REPO / "cluster.yaml"), IMAGE)),
    ],
)
def test_each_kind_matches_its_golden_file(name, make):
    text = dump(make())
    if os.environ.get("SCALEFORGE_UPDATE_GOLDEN"):
        (GOLDEN / name).write_text(text)
    assert text == (GOLDEN / name).read_text(), f"{name} changed: SCALEFORGE_UPDATE_GOLDEN=1 rewrites it"


def test_a_job_sized_from_its_config():
    manifest = job_manifest(str(REPO / "configs/train_lm_big_cpu.yaml"), IMAGE, STORAGE)
    (group,) = manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 2
    resources = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert resources == {"cpu": "1", "memory": "10240Mi"}  # its 10 GiB of Ray memory per worker
    spec = manifest["spec"]
    assert spec["entrypoint"] == (
        "python -m jobs.train --config /app/configs/train_lm_big_cpu.yaml --set=storage=s3://bucket/scaleforge"
    )
    assert spec["shutdownAfterJobFinishes"] and spec["submissionMode"] == "K8sJobMode"
    gpu = job_manifest(str(REPO / "configs/train_lm_1b.yaml"), IMAGE, STORAGE)
    (group,) = gpu["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert (
        group["maxReplicas"] == 8
        and group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    )


@pytest.mark.parametrize(
    "config, sets, message",
    [
        ("train_dp.yaml", (), None),
        ("hwbench.yaml", (), "output=~/scaleforge/hwbench.json is a local path and pods share no disk"),
        ("calibrate.yaml", (), "serve_config=configs/serve.yaml is a local path"),
        ("serve.yaml", (), "is a serve config: generate a RayService"),
    ],
)
def test_local_paths_and_the_wrong_kind_are_refused_naming_the_field(config, sets, message):
    if message is None:  # a local storage root itself
        with pytest.raises(ManifestError, match="--storage /data: pods share no disk"):
            job_manifest(str(REPO / "configs" / config), IMAGE, "/data", sets)
        return
    with pytest.raises(ManifestError, match=message):
        job_manifest(str(REPO / "configs" / config), IMAGE, STORAGE, sets)


def test_a_config_error_names_the_field():
    with pytest.raises(ConfigError, match="optim.lr"):
        job_manifest(str(REPO / "configs/train_dp.yaml"), IMAGE, STORAGE, ("optim.lr=fast",))


def _job():
    return job_manifest(str(REPO / "configs/train_dp.yaml"), IMAGE, STORAGE)


def _worker(manifest):
    return manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]


RULES = [  # the operator's rules that its schema does not carry
    (
        lambda m: m["metadata"].update(name="Scaleforge_Train"),
        "metadata.name: 'Scaleforge_Train' must be a DNS-1035",
    ),
    (lambda m: m["metadata"].update(name="a" * 48), "at most 47 characters for a RayJob"),
    (
        lambda m: _worker(m).update(minReplicas=3, maxReplicas=2),
        r"workerGroupSpecs\[0\].minReplicas: 3 is above",
    ),
    (lambda m: m["spec"].pop("rayClusterSpec"), "a RayJob needs rayClusterSpec or clusterSelector"),
    (lambda m: m["spec"].update(runtimeEnvYAML="env_vars: [unclosed"), "spec.runtimeEnvYAML: not YAML"),
    (lambda m: m["spec"].update(runtimeEnvYAML="just words"), "spec.runtimeEnvYAML: must be a YAML mapping"),
    (lambda m: m["spec"].update(submissionMode="K8sMode"), "spec.submissionMode: 'K8sMode' is not one of"),
    (
        lambda m: (
            m["spec"]["rayClusterSpec"].update(
                enableInTreeAutoscaling=True, autoscalerOptions={"version": "v2"}
            ),
            _worker(m)["template"]["spec"].pop("restartPolicy"),
        ),
        r"template.spec.restartPolicy: autoscaler v2 needs Never",
    ),
    (lambda m: _worker(m)["template"]["spec"].update(containers=[]), r"containers: a worker group needs"),
]


def test_a_cluster_name_may_have_53_characters_and_a_service_needs_a_known_upgrade_strategy():
    cluster = cluster_manifest(str(REPO / "cluster.yaml"), IMAGE)
    cluster["metadata"]["name"] = "a" * 53
    check_manifest(cluster)
    service = service_manifest(str(REPO / "configs/serve.yaml"), IMAGE, STORAGE)
    service["spec"]["upgradeStrategy"]["type"] = "Rolling"
    with pytest.raises(ManifestError, match="spec.upgradeStrategy.type: 'Rolling' is not one of"):
        check_manifest(service)


MUTATIONS = [
    (lambda m: _worker(m).update(maxReplica=_worker(m).pop("maxReplicas")), "'maxReplica' was unexpected"),
    (
        lambda m: _worker(m).update(minReplicas="two"),
        r"workerGroupSpecs\[0\].minReplicas: 'two' is not of type",
    ),
    (
        lambda m: _worker(m)["template"]["spec"]["containers"][0]["resources"]["limits"].update(
            cpu="two cores"
        ),
        r"containers\[0\].resources.limits.cpu",
    ),
    (lambda m: m["spec"].update(backoffLimit="0"), "spec.backoffLimit: '0' is not of type 'integer'"),
    (lambda m: _worker(m)["template"]["spec"]["containers"][0].pop("name"), "'name' is a required property"),
]


BROKEN = [(*rule, False) for rule in RULES] + [(*mutation, True) for mutation in MUTATIONS]
"""The operator's rules (checked by our code) and mutations that its strict schema refuses."""


@pytest.mark.parametrize("edit, message, by_schema", BROKEN, ids=[m[:40] for _, m, _ in BROKEN])
def test_a_broken_job_is_refused_naming_the_field(edit, message, by_schema):
    if by_schema and crd_folder() is None:
        pytest.skip(f"KubeRay's CRDs not found: set {CRD_ENV} (../shared/kuberay/v1.7.0)")
    manifest = _job()
    edit(manifest)
    with pytest.raises(ManifestError, match=message):
        check_manifest(manifest)


def test_rays_kuberay_autoscaler_reads_the_cluster_back_as_cluster_yamls_node_types():
    from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr

    launcher = load_cluster_config(str(REPO / "cluster.yaml"))
    applied = cluster_manifest(str(REPO / "cluster.yaml"), IMAGE)
    applied["metadata"]["namespace"] = "default"  # the API server's, on kubectl apply
    derived = _derive_autoscaling_config_from_ray_cr(applied)
    ours = {
        name.replace("_", "-"): (node["min_workers"], node["max_workers"], node["resources"])
        for name, node in launcher["available_node_types"].items()
        if name != launcher["head_node_type"]
    }
    theirs = {
        name: (
            node["min_workers"],
            node["max_workers"],
            {k: v for k, v in node["resources"].items() if k in ("CPU", "GPU")},
        )
        for name, node in derived["available_node_types"].items()
        if name != "headgroup"
    }
    assert theirs == ours
    assert derived["idle_timeout_minutes"] == launcher["idle_timeout_minutes"]
    assert derived["available_node_types"]["headgroup"]["resources"]["CPU"] == 0


@needs_crds
def test_a_tpu_group_is_one_replica_per_slice_as_rays_autoscaler_reads_it():
    """GKE's v5e 4x4 slice: 16 chips on 4 hosts of 4; Ray's KubeRay autoscaler sees up to 2 slices of
    4 workers, each with 4 TPUs, one of them the slice's head (``TPU-v5litepod-16-head``)."""
    from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr

    applied = cluster_manifest(str(REPO / "cluster.yaml"), IMAGE, tpu="tpu-v5-lite-podslice:4x4:2")
    (group,) = [g for g in applied["spec"]["workerGroupSpecs"] if g["groupName"].startswith("tpu")]
    assert (group["numOfHosts"], group["minReplicas"], group["maxReplicas"]) == (4, 0, 2)
    assert group["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "4x4"
    applied["metadata"]["namespace"] = "default"
    node = _derive_autoscaling_config_from_ray_cr(applied)["available_node_types"][group["groupName"]]
    assert (node["min_workers"], node["max_workers"]) == (0, 8)
    assert node["resources"]["TPU"] == 4 and node["resources"]["TPU-v5litepod-16-head"] == 1
    single = cluster_manifest(str(REPO / "cluster.yaml"), IMAGE, tpu="tpu-v6e-slice:2x2")
    assert single["spec"]["workerGroupSpecs"][-1]["numOfHosts"] == 1  # one host holds 4 chips
    for tpu, message in [
        ("tpu-v9:4x4", "unknown accelerator 'tpu-v9'"),
        ("tpu-v4-podslice:big", "ACCELERATOR:TOPOLOGY"),
        ("tpu-v4-podslice:2x2x2:two", "MAX_SLICES"),
    ]:
        with pytest.raises(ManifestError, match=message):
            cluster_manifest(str(REPO / "cluster.yaml"), IMAGE, tpu=tpu)


def test_the_services_serve_config_parses_back_to_the_serve_config_with_artifacts_in_the_bucket():
    from ray.serve.schema import ServeDeploySchema

    shipped = yaml.safe_load((REPO / "configs/serve.yaml").read_text())
    manifest = service_manifest(str(REPO / "configs/serve.yaml"), IMAGE, STORAGE)
    served = ServeDeploySchema.model_validate(yaml.safe_load(manifest["spec"]["serveConfigV2"]))
    (app,) = served.applications
    (shipped_app,) = shipped["applications"]
    assert app.import_path == shipped_app["import_path"] and app.route_prefix == shipped_app["route_prefix"]
    assert [m["artifact"] for m in app.args["models"]] == [
        m["artifact"].replace("~/scaleforge", STORAGE) for m in shipped_app["args"]["models"]
    ]
    assert app.args["routers"] == shipped_app["args"]["routers"]


def test_the_command_prints_a_manifest_or_one_line_and_exit_status_2(tmp_path):
    import subprocess
    import sys

    command = [
        sys.executable,
        "-m",
        "scaleforge.cluster",
        "kuberay",
        "job",
        "--config",
        "configs/train_dp.yaml",
    ]
    made = subprocess.run(
        [*command, "--image", IMAGE, "--storage", STORAGE, "--out", str(tmp_path / "job.yaml")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    assert yaml.safe_load((tmp_path / "job.yaml").read_text())["kind"] == "RayJob"
    refused = subprocess.run(
        [*command, "--image", IMAGE, "--storage", "~/scaleforge"], cwd=REPO, capture_output=True, text=True
    )
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip() == (
        "error: --storage ~/scaleforge: pods share no disk; give a bucket URI (s3://BUCKET/prefix)"
    )
