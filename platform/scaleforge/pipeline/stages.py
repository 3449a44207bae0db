"""The main job's stages, chained through one output folder, each reusing its artifacts when they exist.

A stage's record (``records/<stage>.json``, written atomically after the stage succeeded) says
where its artifacts are and what it measured; a later run skips every recorded stage before
``redo_from``. A stage that fails writes no record, and earlier records and artifacts stay as
they were.
"""

import json
import time
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from scaleforge.cluster import free_ports
from scaleforge.config import (AsyncSGDConfig, CalibrateConfig, CompressJobConfig, ServeConfig, TrainJobConfig,
                               load_config)
from scaleforge.config.pipeline import STAGES, PipelineConfig
from scaleforge.storage import write_atomic

Record = dict[str, Any]


class StageFailed(RuntimeError):
    """A stage raised; the message names it and how to resume."""


class Pipeline:
    """Runs the stages of ``cfg`` in order; ``redo_from`` redoes that stage and every later one."""

    def __init__(self, cfg: PipelineConfig, redo_from: Optional[str] = None, log: Callable[[str], None] = print):
        if redo_from is not None and redo_from not in STAGES:
            raise ValueError(f"--from {redo_from!r}: not a stage; stages are {', '.join(STAGES)}")
        self.cfg, self.redo_from, self.log = cfg, redo_from, log
        self.out = Path(cfg.output).expanduser().resolve()
        self.records: dict[str, Record] = {}

    def run(self, serve_and_query: Callable[["Pipeline"], Record]) -> dict[str, Record]:
        """Every training stage (reused or run), then ``serve_and_query`` against the result."""
        started = time.perf_counter()
        for index, stage in enumerate(STAGES[:-2], start=1):
            reused = self._recorded(stage)
            if reused is not None and not self._redo(stage):
                self.records[stage] = reused
                self.log(f"[pipeline] {index}/{len(STAGES)} {stage}: reused ({self._record_path(stage)})")
                continue
            self.log(f"[pipeline] {index}/{len(STAGES)} {stage}: running ...")
            began = time.perf_counter()
            try:
                if self.cfg.fault.fail_at_stage == stage:
                    raise RuntimeError(f"injected failure (fault.fail_at_stage={stage})")
                record = getattr(self, f"_{stage}")()
            except Exception as err:
                raise StageFailed(f"stage {stage} failed: {err}; earlier stages are kept, resume with "
                                  f"--from {stage}") from err
            record["wall_s"] = time.perf_counter() - began
            self._write_record(stage, record)
            self.records[stage] = record
            self.log(f"[pipeline] {stage}: done in {record['wall_s']:.1f} s")
        self.log(f"[pipeline] {len(STAGES) - 1}/{len(STAGES)} serve + {len(STAGES)}/{len(STAGES)} query: running ...")
        self.records["query"] = serve_and_query(self)
        self.records["query"]["pipeline_wall_s"] = time.perf_counter() - started
        self._write_record("query", self.records["query"])
        return self.records

    # -- stages -------------------------------------------------------------------------------

    def _teacher(self) -> Record:
        return self._train("teacher")

    def _moe(self) -> Record:
        record = self._train("moe")
        manifest = json.loads((Path(record["artifact"]) / "manifest.json").read_text())
        if "moe_parts" not in manifest:
            raise ValueError("the moe stage must train a one-block `moe` model, whose gate and experts are exported")
        record["parts"] = manifest["moe_parts"]
        return record

    def _train(self, stage: str) -> Record:
        from scaleforge.train import run_training
        from scaleforge.train.preflight import check_runnable

        cfg = self._stage_config(stage, TrainJobConfig, check_runnable,
                                 f"artifact.dir={self.out / 'artifacts' / stage}",
                                 f"run.storage_path={self.out / 'runs'}")
        result = run_training(cfg)
        return {"artifact": str(result.artifact), "metrics": _plain(result.metrics), "history": _plain(result.history),
                "parameters": result.num_parameters}

    def _async_sgd(self) -> Record:
        from scaleforge.paramserver import run_async_sgd
        from scaleforge.paramserver.preflight import check_runnable

        runs = {}
        for mode in self.cfg.async_sgd.modes:
            cfg = self._stage_config("async_sgd", AsyncSGDConfig, check_runnable, f"server.mode={mode}",
                                     f"run.output_dir={self.out / 'async_sgd'}",
                                     f"artifact.dir={self.out / 'artifacts' / f'async_{mode}'}")
            result = run_async_sgd(cfg)
            runs[mode] = {"test_accuracy": result.test_accuracy, "updates": result.updates, "wall_s": result.wall_s,
                          "curve": result.curve, "artifact": str(result.artifact), "plot": str(result.plot_path)}
        return {"runs": runs}

    def _compress(self) -> Record:
        from scaleforge.compress.preflight import check_runnable
        from scaleforge.compress.run import run_compression

        cfg = self._stage_config("compress", CompressJobConfig, check_runnable,
                                 f"teacher={self.records['teacher']['artifact']}",
                                 f"output={self.out / 'artifacts' / 'compressed'}",
                                 f"run.storage_path={self.out / 'runs'}")
        result = run_compression(cfg)
        return {"artifact": str(result.artifact), "output": str(result.output), "report": _plain(result.report)}

    def _calibrate(self) -> Record:
        from scaleforge.routing.calibration import calibrate_cascade, check_runnable

        serve_config = self._write_serve_config()
        cfg = self._stage_config("calibrate", CalibrateConfig, check_runnable, f"serve_config={serve_config}")
        result = calibrate_cascade(cfg)
        return {"serve_config": str(serve_config), "data": cfg.data.model_dump(mode="json"), "thresholds": result.thresholds,
                "answered_per_stage": result.answered_per_stage, "accuracy": result.accuracy,
                "last_stage_accuracy": result.last_stage_accuracy, "held_out": result.held_out}

    # -- helpers ------------------------------------------------------------------------------

    def serve_config(self) -> tuple[ServeConfig, Record]:
        """The calibrated Serve config on a port free right now, each model placed for this cluster's
        hardware; and the placement made."""
        raw = yaml.safe_load(Path(self.records["calibrate"]["serve_config"]).read_text())
        raw.setdefault("http_options", {})["port"] = free_ports(1)[0]
        app = raw["applications"][0]
        placement = self._place(app)
        return ServeConfig.model_validate(raw), placement

    def _place(self, app: dict) -> Record:
        """Measure the cluster (or read ``placement.hwbench``) and place the app's models by it."""
        from scaleforge.hardware import measure_cluster, read_reports
        from scaleforge.placement import ClusterHardware, place_models

        spec = self.cfg.placement
        if not spec.enabled:
            return {"enabled": False}
        reports = (read_reports(spec.hwbench) if spec.hwbench
                   else measure_cluster(cpu_size=256, gpu_size=2048, repeats=2))
        hardware = ClusterHardware.from_reports(reports)
        app["args"], where = place_models(app["args"], hardware, gpu_share=spec.gpu_share,
                                          gpu_min_parameters=spec.gpu_min_parameters)
        self.log(f"[pipeline] placement: {len(hardware.cpu_nodes)} CPU-only node(s), {len(hardware.gpu_nodes)} "
                 f"GPU node(s); " + ", ".join(f"{name}->{kind}" for name, kind in where.items()))
        return {"enabled": True, "cpu_nodes": len(hardware.cpu_nodes), "gpu_nodes": len(hardware.gpu_nodes),
                "models": where, "devices": [r.to_dict() for r in reports]}

    def _write_serve_config(self) -> Path:
        """The serve stage's config: ``serve.config`` with its models pointed at this run's artifacts."""
        raw = yaml.safe_load(Path(self.cfg.serve.config).read_text())
        parts = self.records["moe"]["parts"]
        produced = {"teacher": self.records["teacher"]["artifact"], "student": self.records["compress"]["artifact"],
                    "moe-gate": parts["gate"], **{f"moe-expert-{i}": p for i, p in enumerate(parts["experts"])}}
        args = raw["applications"][0]["args"]
        args["models"] = [dict(m, artifact=produced[m["name"]]) for m in args["models"] if m["name"] in produced]
        missing = set(produced) - {m["name"] for m in args["models"]}
        if missing:
            raise ValueError(f"{self.cfg.serve.config}: no model entries named {sorted(missing)} to serve this run's "
                             "artifacts under")
        for router in args.get("moe", []):
            router["experts"] = [f"moe-expert-{i}" for i in range(len(parts["experts"]))]
        target = self.out / "serve.yaml"
        write_atomic(target, f"# ray serve config written by jobs.pipeline from {self.cfg.serve.config}\n"
                              + yaml.safe_dump(raw, sort_keys=False))
        return target

    def _stage_config(self, stage: str, schema, preflight: Callable, *forced: str):
        """The stage's own config with this run's paths forced, pre-flighted as its job would be."""
        spec = getattr(self.cfg, stage)
        return load_config(schema, spec.config, [*spec.set, *forced], preflight)

    def _redo(self, stage: str) -> bool:
        return self.redo_from is not None and STAGES.index(stage) >= STAGES.index(self.redo_from)

    def _record_path(self, stage: str) -> Path:
        return self.out / "records" / f"{stage}.json"

    def _recorded(self, stage: str) -> Optional[Record]:
        path = self._record_path(stage)
        return json.loads(path.read_text()) if path.is_file() else None

    def _write_record(self, stage: str, record: Record) -> None:
        write_atomic(self._record_path(stage), json.dumps(record, indent=2) + "\n")


def _plain(value: Any) -> Any:
    """JSON-ready copy (numpy scalars and paths become plain values)."""
    return json.loads(json.dumps(value, default=lambda v: v.item() if hasattr(v, "item") else str(v)))

