// What the conversation shows: user utterances with their unstable tail, and assistant
// replies whose diffusion drafts settle into text, with the part already heard marked.
// The models here hold text and audio positions; the view turns them into DOM.

/** One user utterance: live partials, then the completed transcript. */
export class UserUtterance {
  constructor(itemId) {
    this.itemId = itemId;
    this.deltaText = ""; // from transcription .delta events
    this.partial = null; // latest {stable, unstable} from x_input_audio_transcription.partial
    this.finalText = null;
  }

  /** @returns {{stable: string, unstable: string}} */
  parts() {
    if (this.finalText !== null) return { stable: this.finalText, unstable: "" };
    if (this.partial) return this.partial;
    return { stable: this.deltaText, unstable: "" };
  }
}

/**
 * One assistant reply. Text comes from three places: diffusion drafts (the whole reply,
 * committed prefix + still-changing rest), the transcript of what was sent to speech,
 * and the audio itself. To mark what has been heard, each transcript delta is tied to
 * the audio that arrives after it (its sentence), and the play head is mapped back
 * through those segments to a character count.
 */
export class AssistantReply {
  constructor(responseId) {
    this.responseId = responseId;
    this.itemId = null;
    this.transcript = "";
    this.committed = "";
    this.draft = "";
    this.draftStep = null;
    this.tokensPerForward = null;
    this.segments = []; // [{chars, audioStart, audioEnd}] in wire samples
    this.receivedSamples = 0;
    this.playedSamples = 0;
    this.finished = false;
    this.status = "in_progress";
    this.interrupted = false;
    this.metrics = null;
    this.heardAfterMs = null; // end of the user's turn -> first audio played, measured here
    this.heardMs = null; // audio_end_ms the server confirmed after a barge-in
  }

  setDraft(committedText, draftText, step, tokensPerForward) {
    this.committed = committedText || "";
    this.draft = draftText || "";
    this.draftStep = step;
    this.tokensPerForward = tokensPerForward;
  }

  addTranscriptDelta(delta) {
    const audioStart = this.segments.length === 0 ? 0 : this.receivedSamples;
    this.segments.push({ chars: delta.length, audioStart, audioEnd: this.receivedSamples });
    this.transcript += delta;
  }

  addAudio(samples) {
    this.mergeSegmentsWaitingForAudio();
    this.receivedSamples += samples;
    const last = this.segments[this.segments.length - 1];
    if (last) last.audioEnd = this.receivedSamples;
  }

  // Several text deltas before any of their audio (word-by-word text) share that audio.
  mergeSegmentsWaitingForAudio() {
    let first = this.segments.length;
    while (first > 0 && this.segments[first - 1].audioEnd === this.segments[first - 1].audioStart) first--;
    if (this.segments.length - first < 2) return;
    const merged = this.segments.splice(first);
    this.segments.push({
      chars: merged.reduce((sum, segment) => sum + segment.chars, 0),
      audioStart: merged[0].audioStart,
      audioEnd: merged[0].audioEnd,
    });
  }

  finishTranscript(text) {
    const extra = text.length - this.transcript.length;
    if (extra !== 0 && this.segments.length > 0) {
      this.segments[this.segments.length - 1].chars = Math.max(0, this.segments[this.segments.length - 1].chars + extra);
    }
    this.transcript = text;
  }

  finish(status) {
    this.finished = true;
    this.status = status;
  }

  /** How many characters of the transcript have been heard so far. */
  spokenChars() {
    if (this.finished && !this.interrupted && this.receivedSamples > 0 && this.playedSamples >= this.receivedSamples) {
      return this.transcript.length;
    }
    let chars = 0;
    for (const segment of this.segments) {
      if (this.playedSamples >= segment.audioEnd && segment.audioEnd > segment.audioStart) {
        chars += segment.chars;
        continue;
      }
      if (this.playedSamples > segment.audioStart && segment.audioEnd > segment.audioStart) {
        const fraction = (this.playedSamples - segment.audioStart) / (segment.audioEnd - segment.audioStart);
        chars += Math.floor(segment.chars * fraction);
      }
      break;
    }
    return Math.min(chars, this.transcript.length);
  }

  /**
   * The reply split for display: heard, settled (solid) and draft (dimmed) text.
   * @returns {{spoken: string, settled: string, draft: string}}
   */
  parts() {
    const settledText = this.settledText();
    const whole = this.committed + this.draft;
    const draft = !this.finished && whole.startsWith(settledText) ? whole.slice(settledText.length) : "";
    const spokenLength = Math.min(this.spokenChars(), settledText.length);
    return { spoken: settledText.slice(0, spokenLength), settled: settledText.slice(spokenLength), draft };
  }

  // The longest text known to be final: the committed draft prefix or the spoken transcript.
  settledText() {
    if (this.finished && this.transcript) return this.transcript;
    if (this.committed.startsWith(this.transcript)) return this.committed;
    return this.transcript;
  }
}

/** Renders utterances and replies into the conversation list. */
export class ConversationView {
  /**
   * @param {HTMLElement} list the <ol> holding the conversation
   * @param {HTMLElement} announcer a visually hidden aria-live region for finished turns
   */
  constructor(list, announcer) {
    this.list = list;
    this.announcer = announcer;
    this.userElements = new Map();
    this.replyElements = new Map();
  }

  renderUser(utterance) {
    const element = this.userElements.get(utterance.itemId) || this.createMessage("user", utterance.itemId);
    const { stable, unstable } = utterance.parts();
    const text = element.querySelector('[data-role="user-transcript"]');
    // the server sends the two parts without the space between them (its text is "stable unstable")
    const gap = stable && unstable ? " " : "";
    text.replaceChildren(span("stable", stable), span("unstable", gap + unstable));
    text.classList.toggle("pending", !stable && !unstable);
    element.classList.toggle("final", utterance.finalText !== null);
    this.keepBottomInView();
  }

  removeUser(itemId) {
    const element = this.userElements.get(itemId);
    if (element) element.remove();
    this.userElements.delete(itemId);
  }

  renderReply(reply) {
    const element = this.replyElements.get(reply.responseId) || this.createMessage("assistant", reply.responseId);
    const { spoken, settled, draft } = reply.parts();
    const text = element.querySelector('[data-role="assistant-transcript"]');
    text.replaceChildren(span("spoken", spoken, "mark"), span("settled", settled), span("draft", draft));
    text.classList.toggle("pending", !spoken && !settled && !draft);
    text.dataset.interrupted = String(reply.interrupted);
    text.dataset.status = reply.status;
    if (reply.heardMs != null) text.dataset.heardMs = String(reply.heardMs);
    if (reply.itemId) element.dataset.itemId = reply.itemId;
    element.querySelector('[data-role="turn-metrics"]').textContent = describeReply(reply);
    renderTimeline(element.querySelector('[data-role="turn-timeline"]'), reply);
    this.keepBottomInView();
  }

  announce(text) {
    this.announcer.textContent = text;
  }

  addNote(text) {
    const note = document.createElement("li");
    note.className = "note";
    note.textContent = text;
    this.list.append(note);
    this.keepBottomInView();
  }

  createMessage(kind, id) {
    const item = document.createElement("li");
    item.className = `message ${kind}`;
    const speaker = document.createElement("span");
    speaker.className = "speaker";
    speaker.textContent = kind === "user" ? "You" : "Assistant";
    const text = document.createElement("p");
    text.className = "text";
    text.dataset.role = `${kind}-transcript`;
    item.append(speaker, text);
    if (kind === "user") {
      item.dataset.itemId = id;
      this.userElements.set(id, item);
    } else {
      item.dataset.responseId = id;
      const metrics = document.createElement("p");
      metrics.className = "metrics";
      metrics.dataset.role = "turn-metrics";
      const timeline = document.createElement("div");
      timeline.className = "timeline";
      timeline.dataset.role = "turn-timeline";
      timeline.hidden = true;
      item.append(metrics, timeline);
      this.replyElements.set(id, item);
    }
    this.list.append(item);
    return item;
  }

  keepBottomInView() {
    const scroller = this.list.parentElement;
    const nearBottom = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 160;
    if (nearBottom) scroller.scrollTop = scroller.scrollHeight;
  }
}

// Where a turn's time went, from the server's x_turn.metrics: each bar runs from the end of the
// user's speech to a mark (final transcript, first token, first audio, reply done), scaled to
// the longest; a barge-in shows where it cut the reply and how much was heard.
const TIMELINE_MARKS = [
  ["transcript", "speech_stopped_to_transcript_ms", "final transcript"],
  ["first-token", "speech_stopped_to_first_draft_ms", "first token"],
  ["first-audio", "speech_stopped_to_first_audio_ms", "first audio"],
  ["done", "speech_stopped_to_done_ms", "reply done"],
];

export function renderTimeline(container, reply) {
  const metrics = reply.metrics;
  const marks = metrics ? TIMELINE_MARKS.filter(([, key]) => metrics[key] != null) : [];
  container.hidden = marks.length === 0;
  if (marks.length === 0) return;
  const longest = Math.max(...marks.map(([, key]) => metrics[key]), 1);
  const rows = marks.map(([name, key, label]) => {
    const ms = Math.round(metrics[key]);
    container.dataset[toCamel(name) + "Ms"] = String(ms);
    const row = document.createElement("div");
    row.className = `mark ${name}`;
    row.title = `${label}: ${ms} ms after you stopped speaking`;
    const bar = document.createElement("span");
    bar.className = "bar";
    bar.style.width = `${Math.max(2, (100 * metrics[key]) / longest)}%`;
    row.append(span("label", label), bar, span("ms", `${ms} ms`));
    return row;
  });
  if (metrics.barge_in_to_cleared_ms != null) {
    const heard = reply.heardMs != null ? `, ${(reply.heardMs / 1000).toFixed(1)} s heard` : "";
    const row = document.createElement("div");
    row.className = "mark barge-in";
    row.title = `you talked over it: the reply stopped ${Math.round(metrics.barge_in_to_cleared_ms)} ms after you started`;
    row.append(span("label", "barge-in"), span("ms", `cut after ${Math.round(metrics.barge_in_to_cleared_ms)} ms${heard}`));
    container.dataset.bargeInMs = String(Math.round(metrics.barge_in_to_cleared_ms));
    rows.push(row);
  }
  container.replaceChildren(...rows);
}

function toCamel(name) {
  return name.replace(/-(.)/g, (_, letter) => letter.toUpperCase());
}

function span(className, text, tag = "span") {
  const element = document.createElement(tag);
  element.className = className;
  element.textContent = text;
  return element;
}

/** The small line under a reply: drafting progress, then the turn's measured latency. */
export function describeReply(reply) {
  const facts = [];
  if (reply.interrupted) facts.push(reply.heardMs != null ? `interrupted after ${(reply.heardMs / 1000).toFixed(1)} s` : "interrupted");
  else if (reply.status === "cancelled") facts.push("cancelled");
  else if (reply.status === "failed" || reply.status === "incomplete") facts.push(reply.status);
  const metrics = reply.metrics;
  if (metrics && metrics.speech_stopped_to_first_audio_ms != null) {
    facts.push(`first audio ${Math.round(metrics.speech_stopped_to_first_audio_ms)} ms after you stopped`);
  }
  if (reply.heardAfterMs != null) facts.push(`heard after ${Math.round(reply.heardAfterMs)} ms`);
  const tokensPerForward = metrics && metrics.tokens_per_forward != null ? metrics.tokens_per_forward : reply.tokensPerForward;
  if (tokensPerForward != null) facts.push(`${Number(tokensPerForward).toFixed(1)} tokens/forward`);
  if (metrics && metrics.forward_passes != null) facts.push(`${metrics.forward_passes} forward passes`);
  if (!reply.finished && reply.draftStep != null) facts.push(`drafting, step ${reply.draftStep}`);
  return facts.join(" · ");
}
