from __future__ import annotations

import pytest
import torch

from cleave.common.v1 import common_pb2
from libs.encoder.tensors import from_proto, to_proto


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip_is_exact(dtype: torch.dtype) -> None:
    tensor = torch.randn(5, 7, generator=torch.Generator().manual_seed(0)).to(dtype)
    back = from_proto(to_proto(tensor))
    assert back.dtype == dtype and torch.equal(back, tensor)


def test_inconsistent_tensors_are_refused() -> None:
    message = to_proto(torch.zeros(2, 3))
    message.data = message.data[:-4]
    with pytest.raises(ValueError, match="need 24 bytes, got 20"):
        from_proto(message)
    with pytest.raises(ValueError, match=r"\[num_tokens, hidden_size\]"):
        from_proto(common_pb2.Tensor(dtype=common_pb2.DTYPE_FLOAT32, shape=[6], data=b"\0" * 24))
    with pytest.raises(ValueError, match="DTYPE_INT8"):
        from_proto(common_pb2.Tensor(dtype=common_pb2.DTYPE_INT8, shape=[1, 1], data=b"\0"))
