"""
Hypothesis strategies for payloads and frames, shared by the wire tests.

Raw segments stay small here; the large-segment cases are explicit tests.
"""

from __future__ import annotations

from hypothesis import strategies as st

from svc.wire.control import GoAway, Hello, error_frame, goaway_frame, hello_frame
from svc.wire.errno import WireErrno
from svc.wire.frame import MAX_REQUEST_ID, Frame, FrameType

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.binary(max_size=12)
)

values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=10,
)

payloads = st.dictionaries(st.text(max_size=8), values, max_size=4)

request_ids = st.integers(min_value=1, max_value=MAX_REQUEST_ID)

raws = st.binary(max_size=48)

ops = st.text(min_size=1, max_size=16)


@st.composite
def _with_op(draw: st.DrawFn, frame_type: FrameType) -> Frame:
    payload = draw(payloads)
    payload["op"] = draw(ops)
    request_id = draw(request_ids) if frame_type is FrameType.REQUEST else 0
    return Frame(frame_type, request_id, payload, draw(raws))


@st.composite
def _response(draw: st.DrawFn) -> Frame:
    return Frame(FrameType.RESPONSE, draw(request_ids), draw(payloads), draw(raws))


@st.composite
def _error(draw: st.DrawFn) -> Frame:
    details = draw(st.none() | payloads)
    return error_frame(
        draw(request_ids), draw(st.sampled_from(WireErrno)), draw(st.text(max_size=40)), details
    )


@st.composite
def _hello(draw: st.DrawFn) -> Frame:
    u32 = st.integers(min_value=1, max_value=2**32 - 1)
    return hello_frame(
        Hello(
            versions=tuple(draw(st.lists(st.integers(1, 255), min_size=1, max_size=4))),
            max_payload=draw(u32),
            max_raw=draw(st.integers(min_value=0, max_value=2**32 - 1)),
            max_in_flight=draw(u32),
            server=draw(st.text(max_size=20)),
        )
    )


@st.composite
def _goaway(draw: st.DrawFn) -> Frame:
    return goaway_frame(GoAway(draw(st.text(max_size=20)), draw(st.text(max_size=40))))


FRAMES_BY_TYPE = {
    FrameType.HELLO: _hello(),
    FrameType.REQUEST: _with_op(FrameType.REQUEST),
    FrameType.RESPONSE: _response(),
    FrameType.ERROR: _error(),
    FrameType.PUSH: _with_op(FrameType.PUSH),
    FrameType.GOAWAY: _goaway(),
}
"""A strategy of valid frames for each frame type."""

frames = st.one_of(*FRAMES_BY_TYPE.values())
"""Valid frames of any type."""
