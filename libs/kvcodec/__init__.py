"""KV-cache codecs: compact wire encodings for KV chunks handed between workers.

``libs.kvcodec.mxint8``: OCP MXINT8 (int8 elements, one E8M0 scale per 32 values).
"""

from libs.kvcodec.mxint8 import MxTensor, decode, encode, encoded_nbytes, from_bytes, to_bytes

__all__ = ["MxTensor", "decode", "encode", "encoded_nbytes", "from_bytes", "to_bytes"]
