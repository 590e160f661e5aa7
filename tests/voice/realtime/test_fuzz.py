"""Protocol fuzz over a real websocket with a canary session (issue 18): a subset of
voice_app/loadtest/fuzz_corpus.py, run by fuzz.py in both dialects; every case must hold and the canary
must keep getting spoken replies. The whole corpus (~170 cases) runs in scripts/fuzz_realtime.py,
which also reports the canary's audio gaps and the server's loop lag."""

from __future__ import annotations

import pytest

from voice_app.loadtest.fuzz import corpus, run_fuzz

pytestmark = pytest.mark.slow

SUBSET = {
    "session.update/deep_nesting", "conversation.item.create/huge_integer", "response.create/wrong_type_response_0",
    "conversation.item.truncate/missing_audio_end_ms", "input_audio_buffer.commit/unknown_field",
    "instructions/empty_on_a_fresh_session", "audio/odd_length", "audio/6_MiB_append", "audio/16_MiB_message",
    "audio/whole_utterance_in_one_append", "audio/two_commits_back_to_back", "response/50_creates_in_a_row",
    "frame/binary", "frame/not_json",
    "beta/session.update/wrong_type_session_0", "beta/response.create/huge_integer", "beta/audio/odd_length",
    "conversation.item.retrieve/missing_item_id", "conversation.item.delete/unknown_field",
    "session/one_bad_setting_among_good_ones", "beta/session/one_bad_setting_among_good_ones",
}


async def test_a_fuzz_subset_holds_and_the_canary_keeps_talking(make_server, test_audio):
    server = make_server()
    cases = [case for case in corpus(test_audio["question"]) if case.name in SUBSET]
    assert len(cases) == len(SUBSET)
    report = await run_fuzz(server.ws_url + "/realtime", cases, test_audio["question"],
                            metrics_url=server.base_url + "/metrics")
    print(report["results"], report["canary"], report["server_loop_lag_max_ms"])
    assert report["failed"] == [] and report["held"] == len(SUBSET)
    assert report["canary"]["replies"] >= 2 and report["canary"]["failed_replies"] == 0
    assert report["canary"]["reconnects"] == 0
