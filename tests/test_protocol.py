import pytest

from eaglewatch import protocol


def test_roundtrip_stamps_the_version():
    line = protocol.encode(protocol.make_event(protocol.EVENT_PHASE, phase="loading"))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    event = protocol.decode(line)
    assert event["v"] == protocol.PROTOCOL_VERSION
    assert event["kind"] == "phase" and event["phase"] == "loading"


def test_unknown_version_is_refused_with_a_clear_message():
    with pytest.raises(protocol.ProtocolVersionError, match="same eaglewatch version"):
        protocol.decode(b'{"v": 99, "kind": "phase"}')


@pytest.mark.parametrize("junk", [b"not json", b"[1,2]", b'"text"'])
def test_junk_is_a_protocol_error(junk):
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(junk)


def test_log_chunks_carry_raw_bytes():
    raw = b"\x1b[1;36m(Worker_TP0 pid=1)\x1b[0m 50%|\r\xe2\x96\x88"
    message = protocol.decode(protocol.encode(protocol.log_message("run-1", 4096, raw)))
    assert message["offset"] == 4096
    assert protocol.log_payload(message) == raw
