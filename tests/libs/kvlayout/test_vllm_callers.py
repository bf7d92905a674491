"""Every caller gets the same KvLayout for the same engine: the layout a worker reports in
GetInfo and stamps on handoffs (which the gateway's kvstore lookups use) is the layout the
kvstore connector inside that worker's engine keys chunks by. If they differed, every kvstore
lookup would miss without an error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from cleave.common.v1 import common_pb2
from libs.kvconnector.vllm_connector import KvStoreConnector
from libs.worker.layout import kv_layout
from libs.worker.vllm_engine import _engine_info
from tests.libs.kvlayout.fake_vllm_config import fake_vllm_config, model_folder


def worker_layout(vllm_config: object) -> common_pb2.KvLayout:
    return kv_layout(_engine_info(vllm_config))


def connector_layout(vllm_config: object) -> common_pb2.KvLayout:
    connector = KvStoreConnector(vllm_config, KVConnectorRole.SCHEDULER)
    return connector._layout


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size", [16, 64])
def test_worker_and_connector_compute_the_same_layout(
    tmp_path: Path, dtype: torch.dtype, block_size: int
) -> None:
    config = fake_vllm_config(model_folder(tmp_path), dtype=dtype, block_size=block_size)
    reported = worker_layout(config)
    assert reported == connector_layout(config)
    # Every field is filled in, so equal layouts are not equal by being empty.
    for field in common_pb2.KvLayout.DESCRIPTOR.fields:
        assert getattr(reported, field.name), field.name


def test_layouts_of_different_engines_differ(tmp_path: Path) -> None:
    model = model_folder(tmp_path)
    float32 = fake_vllm_config(model, dtype=torch.float32)
    bfloat16 = fake_vllm_config(model, dtype=torch.bfloat16)
    assert worker_layout(float32) != worker_layout(bfloat16)
    assert connector_layout(float32) != connector_layout(bfloat16)
