"""KServe V2 over gRPC without a server: requests checked as HTTP's are, responses with raw tensors.
(Through Serve's gRPC proxy with tritonclient: ``test_serving_http.py``.)"""

import importlib

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from scaleforge.config.serve import GrpcOptions
from scaleforge.serving_contract import ProtocolError
from serving import grpc_v2
from serving.responses import infer_response


def _request(rows: np.ndarray, *, raw: bool = True, **parameters) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="teacher", id="r-1")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=list(rows.shape))
    if raw:
        request.raw_input_contents.append(rows.astype("<f4").tobytes())
    else:
        tensor.contents.fp32_contents.extend(rows.ravel().tolist())
    for key, value in parameters.items():
        request.parameters[key].CopyFrom(grpc_v2._parameter(value))
    return request


def test_the_default_servicer_is_this_module_and_serve_can_import_it():
    (path,) = GrpcOptions().grpc_servicer_functions
    assert path == grpc_v2.SERVICER
    module, _, name = path.rpartition(".")
    assert getattr(importlib.import_module(module), name) is grpc_v2.add_servicer_to_server


def test_raw_and_typed_contents_give_the_same_request_with_its_parameters():
    x = np.arange(80, dtype=np.float32).reshape(2, 40) / 7
    raw = grpc_v2.parse_model_infer(_request(x, trace=True, min_confidence=0.75, max_stage=1), 40, 64)
    typed = grpc_v2.parse_model_infer(_request(x, raw=False), 40, 64)
    np.testing.assert_array_equal(raw.x, x)
    np.testing.assert_array_equal(typed.x, x)
    assert raw.parameters == {"trace": True, "min_confidence": 0.75, "max_stage": 1} and raw.id == "r-1"


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda r: r.raw_input_contents.append(b"\0" * 8), "2 raw_input_contents for 1 input(s)"),
        (lambda r: r.inputs[0].contents.fp32_contents.append(1.0), "both contents and raw_input_contents"),
        (
            lambda r: r.ClearField("raw_input_contents"),
            "no data (contents.fp32_contents or raw_input_contents)",
        ),
        (
            lambda r: r.parameters["trace"].CopyFrom(pb.InferParameter(int64_param=1)),
            "parameters.trace must be true or false",
        ),
        (
            lambda r: r.inputs.add(name="extra", datatype="FP32", shape=[1, 40]),
            "expected exactly 1 input tensor, got 2",
        ),
        (lambda r: setattr(r.inputs[0], "datatype", "FP64"), "datatype must be FP32, got 'FP64'"),
    ],
)
def test_bad_requests_are_refused_with_400_naming_the_problem(change, message):
    request = _request(np.zeros((3, 40), np.float32))
    change(request)
    with pytest.raises(ProtocolError, match=message.replace("(", r"\(").replace(")", r"\)")) as refused:
        grpc_v2.parse_model_infer(request, 40, 64)
    assert refused.value.status == 400


def test_the_response_carries_each_output_as_raw_little_endian_bytes():
    outputs = {
        "class": np.array([3, 7]),
        "probabilities": np.full((2, 10), 0.1, np.float32),
        "fallback": np.array([[True, False], [False, False]]),
    }
    answer = grpc_v2.model_infer_response(infer_response("moe", "r-2", outputs, None, {"fallbacks": 1}))
    assert [(o.name, o.datatype, list(o.shape)) for o in answer.outputs] == [
        ("class", "INT64", [2]),
        ("probabilities", "FP32", [2, 10]),
        ("fallback", "BOOL", [2, 2]),
    ]
    assert np.frombuffer(answer.raw_output_contents[0], "<i8").tolist() == [3, 7]
    assert np.frombuffer(answer.raw_output_contents[2], "?").tolist() == [True, False, False, False]
    assert answer.id == "r-2" and answer.parameters["fallbacks"].int64_param == 1
    # Serve's proxy and replica hand messages to each other by reference to their classes' module:
    # tritonclient names a top-level module ('grpc_service_pb2') that serving.grpc_v2 must provide.
    assert getattr(importlib.import_module(type(answer).__module__), type(answer).__name__) is type(answer)
