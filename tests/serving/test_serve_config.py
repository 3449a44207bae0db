"""configs/serve.yaml is a valid Ray Serve config file and its typed args catch mistakes early."""

import pytest
import yaml
from conftest import REPO
from pydantic import ValidationError
from ray.serve.schema import ServeDeploySchema

from scaleforge.config.serve import ServeArgs

SERVE_YAML = REPO / "configs" / "serve.yaml"


def test_serve_yaml_is_rays_own_format():
    raw = yaml.safe_load(SERVE_YAML.read_text())
    schema = ServeDeploySchema.parse_obj(raw)
    assert schema.http_options.host == "127.0.0.1"
    assert [app.import_path for app in schema.applications] == ["serving.app:build_app"]


def _args(**changes):
    args = yaml.safe_load(SERVE_YAML.read_text())["applications"][0]["args"]
    return {**args, **changes}


@pytest.mark.parametrize(
    "changes,message",
    [
        (
            {
                "routers": [
                    {"kind": "cascade", "name": "c", "stages": [{"model": "student"}, {"model": "teacher"}]}
                ]
            },
            "stage 0 (student) needs a threshold",
        ),
        (
            {
                "routers": [
                    {
                        "kind": "cascade",
                        "name": "c",
                        "stages": [{"model": "student", "threshold": 0.5}, {"model": "ghost"}],
                    }
                ]
            },
            "cascade 'c' names models that are not served: ghost",
        ),
        (
            {
                "routers": [
                    {"kind": "moe", "name": "m", "gate": "moe-gate", "experts": ["moe-expert-0"], "top_k": 2}
                ]
            },
            "top_k (2) exceeds the number of experts (1)",
        ),
        (
            {
                "routers": [
                    {
                        "kind": "cascade",
                        "name": "teacher",
                        "stages": [{"model": "student", "threshold": 0.5}, {"model": "teacher"}],
                    }
                ]
            },
            "names must be unique across models and routers: teacher",
        ),
        ({"auth": {"token_env": "A", "token_file": "b"}}, "give token_env or token_file, not both"),
        (
            {"routers": [{"kind": "translator", "name": "g"}]},
            "Input tag 'translator' found using 'kind' does not match any of the expected tags: "
            "'cascade', 'moe', 'early_exit', 'generator'",
        ),
    ],
)
def test_args_errors_name_the_problem(changes, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ServeArgs.model_validate(_args(**changes))


def test_serve_job_refuses_missing_artifacts_before_ray_starts(tmp_path, capsys):
    import ray

    import jobs.serve

    raw = yaml.safe_load(SERVE_YAML.read_text())
    for model in raw["applications"][0]["args"]["models"]:
        model["artifact"] = str(tmp_path / "missing" / model["name"])
    config = tmp_path / "serve.yaml"
    config.write_text("# python -m jobs.serve --config serve.yaml\n" + yaml.safe_dump(raw))
    started_before = ray.is_initialized()
    assert jobs.serve.main(["--config", str(config)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {config}: application 'scaleforge':")
    assert "not a model artifact (no manifest.json)" in error and len(error.strip().splitlines()) == 1
    assert ray.is_initialized() == started_before
    assert jobs.serve.main(["--config", str(config), "--set", "http_options.port=70000"]) == 2


def _with_in_ingress(name: str, **fields) -> dict:
    args = _args()
    args["models"] = [{**m, "in_ingress": True, **fields} if m["name"] == name else m for m in args["models"]]
    return args


def test_a_model_in_the_ingress_reserves_nothing_and_cannot_be_an_expert_or_hold_a_gpu():
    # configs/serve.yaml runs the student in the ingress: against it as a deployment of its own.
    plain = ServeArgs.model_validate(_with_in_ingress("student", in_ingress=False))
    inside = ServeArgs.model_validate(_with_in_ingress("student"))
    assert plain.model("student").cpus_asked > 0
    assert (
        inside.model("student").in_ingress
        and inside.cpus_asked == plain.cpus_asked - plain.model("student").cpus_asked
    )
    with pytest.raises(
        ValidationError, match=r"moe 'moe': moe-gate set in_ingress; a router calls its gate and experts"
    ):
        ServeArgs.model_validate(_with_in_ingress("moe-gate"))
    with pytest.raises(
        ValidationError, match=r"model 'student': in_ingress runs it in the ingress replica on CPU"
    ):
        ServeArgs.model_validate(_with_in_ingress("student", num_gpus=0.5))
