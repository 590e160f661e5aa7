// The page's controller: turns server events into conversation state, decides the
// turn-taking state shown to the user, and handles barge-in on the client side
// (stop playback now, tell the server how much of the reply was actually heard).

import { AudioIO, WIRE_RATE, base64ToPcm16, pcm16ToBase64 } from "./audio.js";
import { AssistantReply, ConversationView, UserUtterance } from "./conversation.js";
import { RealtimeConnection, realtimeProtocols, realtimeUrl } from "./realtime.js";

const $ = (role) => document.querySelector(`[data-role="${role}"]`);

// Read by browser tests and handy in the devtools console.
const voiceStats = {
  connection: "connecting",
  state: "idle",
  samplesPlayed: 0, // assistant audio actually rendered, in 24 kHz samples
  queuedSamples: 0, // assistant audio waiting in the playback buffer
  turns: 0, // assistant replies started
  interruptions: 0,
  resumes: 0, // replies the server paused for a sound that held no words, then resumed
  lastTruncateMs: null, // audio_end_ms of the page's last conversation.item.truncate (exact, from the player)
  lastLatencyMs: null, // end of user speech (as the page learns it) -> first reply audio played
  lastServerLatencyMs: null, // the server's own speech_stopped_to_first_audio_ms
  lastTokensPerForward: null,
  micLevel: 0, // the microphone's level, 0-100 (a -60..0 dBFS scale), over the last frame
  micLevelPeak: 0, // the highest level since the page opened
  lastTurnMetrics: null, // the server's last x_turn.metrics
  session: null, // the session as the server last described it (session.created / .updated)
  sessionId: null,
  errors: [],
};
window.voiceStats = voiceStats;

const SETTINGS_KEY = "voice-assistant-settings";
// engineMode "" and engineThreshold "": the server's own decoding (its --engine-mode, exact)
const DEFAULT_SETTINGS = {
  turnDetection: "server_vad", eagerness: "auto", voice: null, instructions: "", showDrafts: true,
  engineMode: "", engineThreshold: "",
};

function loadSettings() {
  try {
    return { ...DEFAULT_SETTINGS, ...JSON.parse(localStorage.getItem(SETTINGS_KEY) || "{}") };
  } catch {
    return { ...DEFAULT_SETTINGS };
  }
}

/** session.update's session for the page's settings (what the person chose, remembered here). */
function sessionConfig(settings, serverEngine = null) {
  const turnDetection = { type: settings.turnDetection };
  if (settings.turnDetection === "semantic_vad") turnDetection.eagerness = settings.eagerness;
  const output = { format: { type: "audio/pcm", rate: WIRE_RATE } };
  if (settings.voice) output.voice = settings.voice;
  const session = {
    type: "realtime",
    output_modalities: ["audio"],
    audio: { input: { format: { type: "audio/pcm", rate: WIRE_RATE }, turn_detection: turnDetection }, output },
  };
  if (settings.instructions.trim()) session.instructions = settings.instructions.trim();
  const engine = engineConfig(settings, serverEngine, voiceStats.session && voiceStats.session.x_engine);
  if (engine) session.x_engine = engine;
  return session;
}

/** x_engine for the chosen decoding; no choice asks for the server's own (`serverEngine`, from
 * session.created) where the session (`current`) runs another. null: nothing to ask for. */
function engineConfig(settings, serverEngine, current) {
  const chosen = settings.engineMode !== "" || settings.engineThreshold !== "";
  const differs = serverEngine && current && (current.mode !== serverEngine.mode || current.threshold !== serverEngine.threshold);
  if (!chosen && !differs) return null;
  const mode = settings.engineMode || (serverEngine && serverEngine.mode);
  const threshold = settings.engineThreshold === "" ? null : Number(settings.engineThreshold);
  return mode ? { mode, threshold } : { threshold };
}

/** 0-100 on a -60..0 dBFS scale: the RMS of one PCM16 frame. */
function frameLevel(pcm16) {
  const samples = new Int16Array(pcm16);
  let sum = 0;
  for (let i = 0; i < samples.length; i++) sum += samples[i] * samples[i];
  const rms = Math.sqrt(sum / Math.max(1, samples.length)) / 32768;
  const dbfs = 20 * Math.log10(Math.max(rms, 1e-6));
  return Math.max(0, Math.min(100, Math.round(((dbfs + 60) / 60) * 100)));
}

class VoicePage {
  constructor() {
    this.view = new ConversationView($("conversation"), $("announcer"));
    this.audio = new AudioIO({
      onFrame: (pcm16) => this.sendAudioFrame(pcm16),
      onProgress: (progress) => this.onPlaybackProgress(progress),
    });
    this.connection = new RealtimeConnection(realtimeUrl(window.location), {
      onEvent: (event) => this.onServerEvent(event),
      onStatus: (status, detail) => this.onConnectionStatus(status, detail),
      onOpen: () => this.onOpen(),
    }, realtimeProtocols(window.location));
    this.utterances = new Map();
    this.replies = new Map();
    this.currentResponseId = null;
    this.droppedResponses = new Set(); // barged-in replies: their late audio is ignored
    this.truncatedItems = new Set();
    this.heardWhenPaused = new Map(); // responseId -> {itemId, playedSamples}: truncated only if it is cut
    this.userSpeaking = false;
    this.awaitingReplyAt = null; // performance.now() when the user's turn ended
    this.playing = false;
    this.muted = false;
    this.typedTurns = 0;
    this.openedBefore = false;
    this.settings = loadSettings();
    this.settingsPending = false; // a session.update from the settings form awaits its answer
  }

  start() {
    this.bindControls();
    this.connection.connect();
    this.updateState();
  }

  bindControls() {
    $("start").addEventListener("click", () => this.startTalking());
    $("mute").addEventListener("click", () => this.toggleMute());
    $("text-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.sendTypedTurn();
    });
    $("dismiss-error").addEventListener("click", () => this.hideError());
    $("settings-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.applySettings();
    });
    $("show-drafts").addEventListener("change", () => this.showDrafts($("show-drafts").checked));
    this.fillSettingsForm();
    this.loadVoices();
    this.showDrafts(this.settings.showDrafts);
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape") this.stopAssistant();
    });
  }

  // ---- controls -------------------------------------------------------------

  async startTalking() {
    const button = $("start");
    button.disabled = true;
    try {
      await this.audio.startMicrophone();
      button.hidden = true;
      $("mute").disabled = false;
      $("mute").focus();
      document.body.dataset.mic = "on";
    } catch (error) {
      button.disabled = false;
      document.body.dataset.mic = "unavailable";
      const why = error.name === "NotAllowedError" ? "access to the microphone was denied"
        : error.name === "NotFoundError" ? "no microphone was found" : `${error.name || "error"}: ${error.message}`;
      this.showError(`Microphone unavailable (${why}). You can still type.`);
      await this.audio.startPlayback().catch(() => {});
    }
    this.updateState();
  }

  toggleMute() {
    this.muted = !this.muted;
    this.audio.setMuted(this.muted);
    const button = $("mute");
    button.setAttribute("aria-pressed", String(this.muted));
    button.textContent = this.muted ? "Unmute" : "Mute";
    document.body.dataset.muted = String(this.muted);
  }

  async sendTypedTurn() {
    const input = $("text-input");
    const text = input.value.trim();
    if (!text) return;
    if (!this.connection.isOpen) {
      this.showError("Not connected to the server yet; your message was not sent.");
      return;
    }
    input.value = "";
    await this.audio.startPlayback().catch((error) => this.showError(`Audio playback unavailable: ${error.message}`));
    await this.bargeIn({ cancelResponse: true });
    const itemId = `item_typed_${Date.now()}_${++this.typedTurns}`;
    const utterance = new UserUtterance(itemId);
    utterance.finalText = text;
    this.utterances.set(itemId, utterance);
    this.view.renderUser(utterance);
    this.connection.send({
      type: "conversation.item.create",
      item: { id: itemId, type: "message", role: "user", content: [{ type: "input_text", text }] },
    });
    this.connection.send({ type: "response.create" });
    this.awaitingReplyAt = performance.now();
    this.updateState();
  }

  stopAssistant() {
    if (this.replyInFlight() || this.playing) this.bargeIn({ cancelResponse: true });
  }

  // ---- socket ---------------------------------------------------------------

  // ---- settings ------------------------------------------------------------

  fillSettingsForm() {
    $("turn-detection").value = this.settings.turnDetection;
    $("eagerness").value = this.settings.eagerness;
    $("instructions").value = this.settings.instructions;
    $("show-drafts").checked = this.settings.showDrafts;
    $("engine-mode").value = this.settings.engineMode;
    $("engine-threshold").value = this.settings.engineThreshold;
    $("eagerness").disabled = this.settings.turnDetection !== "semantic_vad";
    $("turn-detection").onchange = () => { $("eagerness").disabled = $("turn-detection").value !== "semantic_vad"; };
  }

  applySettings() {
    this.settings = {
      ...this.settings,
      turnDetection: $("turn-detection").value,
      eagerness: $("eagerness").value,
      voice: $("voice").value || null,
      instructions: $("instructions").value,
      showDrafts: $("show-drafts").checked,
      engineMode: $("engine-mode").value,
      engineThreshold: $("engine-threshold").disabled ? "" : $("engine-threshold").value.trim(),
    };
    localStorage.setItem(SETTINGS_KEY, JSON.stringify(this.settings));
    if (!this.connection.isOpen) {
      $("settings-status").textContent = "saved; applied when connected";
      return;
    }
    this.settingsPending = true;
    $("settings-status").textContent = "applying…";
    this.connection.send({ type: "session.update", session: sessionConfig(this.settings, this.serverEngine) });
  }

  // The server's voices come from /healthz (models.voices); the session's own is listed too.
  async loadVoices() {
    try {
      const health = await (await fetch("/healthz")).json();
      this.serverVoices = String((health.models && health.models.voices) || "").split(",").filter(Boolean);
    } catch {
      this.serverVoices = [];
    }
    this.fillVoices();
  }

  fillVoices() {
    const chosen = this.sessionVoice || this.settings.voice;
    const names = new Set([...(this.serverVoices || []), this.sessionVoice, this.settings.voice].filter(Boolean));
    $("voice").replaceChildren(...[...names].map((name) => new Option(name, name, false, name === chosen)));
  }

  showDrafts(on) {
    document.body.dataset.showDrafts = String(on);
  }

  onSessionShape(event) {
    const session = event.session || {};
    voiceStats.session = session;
    voiceStats.sessionId = session.id || voiceStats.sessionId;
    const voice = session.audio && session.audio.output && session.audio.output.voice;
    this.sessionVoice = voice;
    if (event.type === "session.created") this.serverEngine = session.x_engine || null;
    const engine = session.x_engine;
    $("engine-threshold").disabled = Boolean(engine && !engine.takes_threshold);
    if ($("engine-threshold").disabled) $("engine-threshold").value = "";
    $("engine-threshold").title = engine && !engine.takes_threshold
      ? "This model's drafts are verified by the model itself: its replies are exact, a threshold does not apply." : "";
    this.fillVoices();
    if (event.type === "session.updated" && this.settingsPending) {
      this.settingsPending = false;
      const detection = session.audio && session.audio.input && session.audio.input.turn_detection;
      const engine = session.x_engine ? `, ${session.x_engine.mode}` +
        (session.x_engine.threshold != null ? ` at ${session.x_engine.threshold}` : " (exact)") : "";
      $("settings-status").textContent = `applied: ${detection ? detection.type : "no turn detection"}${engine}`;
    }
  }

  onOpen() {
    this.connection.send({ type: "session.update", session: sessionConfig(this.settings) });
    if (this.openedBefore) {
      // The server keeps no history across sockets: a reconnect is a fresh conversation.
      this.resetTurnState();
      this.view.addNote("Reconnected. The assistant starts a fresh conversation.");
    }
    this.openedBefore = true;
  }

  onConnectionStatus(status, detail) {
    voiceStats.connection = status;
    const pill = $("connection");
    pill.dataset.connection = status;
    pill.textContent = { connecting: "connecting", open: "connected", reconnecting: "reconnecting" }[status] || status;
    if (status === "reconnecting" && detail) this.showError(`Disconnected: ${detail}.`, "connection");
    if (status === "open") this.hideError("connection");
    if (status !== "open") this.resetTurnState();
    this.updateState();
  }

  resetTurnState() {
    if (this.currentResponseId) this.droppedResponses.add(this.currentResponseId);
    this.audio.clear();
    this.userSpeaking = false;
    this.awaitingReplyAt = null;
    this.playing = false;
  }

  sendAudioFrame(pcm16) {
    const level = this.muted ? 0 : frameLevel(pcm16);
    voiceStats.micLevel = level;
    voiceStats.micLevelPeak = Math.max(voiceStats.micLevelPeak, level);
    const meter = $("mic-level");
    meter.style.setProperty("--level", `${level}%`);
    meter.setAttribute("aria-valuenow", String(level));
    this.connection.send({ type: "input_audio_buffer.append", audio: pcm16ToBase64(pcm16) });
  }

  onServerEvent(event) {
    const handler = SERVER_EVENT_HANDLERS[event.type];
    if (handler) handler.call(this, event);
    this.updateState();
  }

  // ---- user speech ----------------------------------------------------------

  onSpeechStarted(event) {
    this.userSpeaking = true;
    this.view.renderUser(this.utterance(event.item_id));
    // The user talks over the assistant: stop it at once, whatever the server does.
    if (this.replyInFlight() || this.playing) this.bargeIn({ cancelResponse: false });
  }

  onSpeechStopped() {
    this.userSpeaking = false;
    this.awaitingReplyAt = performance.now();
  }

  onTranscriptionDelta(event) {
    const utterance = this.utterance(event.item_id);
    utterance.deltaText += event.delta || "";
    this.view.renderUser(utterance);
  }

  onTranscriptionPartial(event) {
    const utterance = this.utterance(event.item_id);
    utterance.partial = { stable: event.stable || "", unstable: event.unstable || "" };
    this.view.renderUser(utterance);
  }

  onTranscriptionCompleted(event) {
    const utterance = this.utterance(event.item_id);
    utterance.finalText = (event.transcript || "").trim();
    if (!utterance.finalText) {
      this.view.removeUser(event.item_id); // a noise, not words: no empty bubble
      return;
    }
    this.view.renderUser(utterance);
    this.view.announce(`You said: ${utterance.finalText}`);
  }

  utterance(itemId) {
    if (!this.utterances.has(itemId)) this.utterances.set(itemId, new UserUtterance(itemId));
    return this.utterances.get(itemId);
  }

  // ---- assistant reply ------------------------------------------------------

  onResponseCreated(event) {
    const responseId = event.response && event.response.id;
    if (!responseId) return;
    if (this.currentResponseId && this.currentResponseId !== responseId) this.droppedResponses.add(this.currentResponseId);
    this.currentResponseId = responseId;
    voiceStats.turns += 1;
    this.view.renderReply(this.reply(responseId));
  }

  onDraft(event) {
    if (this.droppedResponses.has(event.response_id)) return;
    const reply = this.reply(event.response_id);
    if (event.item_id) reply.itemId = event.item_id;
    reply.setDraft(event.committed_text, event.draft_text, event.step, event.tokens_per_forward);
    if (event.tokens_per_forward != null) voiceStats.lastTokensPerForward = event.tokens_per_forward;
    this.view.renderReply(reply);
  }

  onAudioDelta(event) {
    // Audio of a reply that was interrupted or superseded must never play.
    if (this.droppedResponses.has(event.response_id) || event.response_id !== this.currentResponseId) return;
    let pcm16;
    try {
      pcm16 = base64ToPcm16(event.delta);
    } catch (error) {
      this.showError(`Bad audio from the server: ${error.message}`);
      return;
    }
    const reply = this.reply(event.response_id);
    reply.itemId = event.item_id;
    reply.addAudio(pcm16.length);
    this.audio.enqueue(event.item_id, pcm16);
  }

  onAudioDone(event) {
    if (event.item_id) this.audio.endItem(event.item_id);
  }

  onAudioTranscriptDelta(event) {
    if (this.droppedResponses.has(event.response_id)) return;
    const reply = this.reply(event.response_id);
    reply.addTranscriptDelta(event.delta || "");
    this.view.renderReply(reply);
  }

  onAudioTranscriptDone(event) {
    if (this.droppedResponses.has(event.response_id)) return;
    const reply = this.reply(event.response_id);
    reply.finishTranscript(event.transcript || "");
    this.view.renderReply(reply);
  }

  onResponseDone(event) {
    const response = event.response || {};
    if (!response.id) return;
    const reply = this.reply(response.id);
    reply.finish(response.status || "completed");
    const paused = this.heardWhenPaused.get(response.id);
    if (paused) {  // cut while paused: the history keeps what this page really played
      this.heardWhenPaused.delete(response.id);
      if (response.status !== "completed") this.truncate(paused.itemId, paused.playedSamples);
    }
    if (reply.itemId) this.audio.endItem(reply.itemId);
    // A reply that ends with no audio to wait for ends the "thinking" phase too.
    if (response.id === this.currentResponseId && reply.receivedSamples === 0) this.awaitingReplyAt = null;
    this.view.renderReply(reply);
    if (reply.transcript) this.view.announce(`Assistant said: ${reply.transcript}`);
  }

  onTurnMetrics(event) {
    const reply = this.reply(event.response_id);
    reply.metrics = event;
    voiceStats.lastTurnMetrics = event;
    if (event.speech_stopped_to_first_audio_ms != null) voiceStats.lastServerLatencyMs = event.speech_stopped_to_first_audio_ms;
    if (event.tokens_per_forward != null) voiceStats.lastTokensPerForward = event.tokens_per_forward;
    this.view.renderReply(reply);
    this.showLatestMetrics(reply);
  }

  reply(responseId) {
    if (!this.replies.has(responseId)) this.replies.set(responseId, new AssistantReply(responseId));
    return this.replies.get(responseId);
  }

  replyInFlight() {
    const reply = this.currentResponseId && this.replies.get(this.currentResponseId);
    return Boolean(reply && !reply.finished && !this.droppedResponses.has(reply.responseId));
  }

  // ---- playback and barge-in -------------------------------------------------

  onPlaybackProgress(progress) {
    voiceStats.samplesPlayed = progress.playedTotal;
    voiceStats.queuedSamples = progress.queuedSamples;
    this.playing = progress.playing;
    const reply = this.replyForItem(progress.itemId);
    if (reply && !this.droppedResponses.has(reply.responseId)) {
      reply.playedSamples = progress.itemPlayedSamples;
      if (progress.playing && this.awaitingReplyAt !== null) {
        reply.heardAfterMs = performance.now() - this.awaitingReplyAt;
        voiceStats.lastLatencyMs = Math.round(reply.heardAfterMs);
        this.awaitingReplyAt = null;
        this.showLatestMetrics(reply);
      }
      this.view.renderReply(reply);
    }
    this.updateState();
  }

  replyForItem(itemId) {
    if (!itemId) return null;
    for (const reply of this.replies.values()) if (reply.itemId === itemId) return reply;
    return null;
  }

  /**
   * Stop the current reply now and drop its queued audio. A typed turn or Escape cuts it
   * (response.cancel, and the server is told what was heard). Speech over it only pauses it:
   * the server may resume it (output_audio_buffer.started: a cough, a "mm-hmm"), and what was
   * heard is reported once the reply ends cut off.
   */
  async bargeIn({ cancelResponse }) {
    const responseId = this.currentResponseId;
    if (!responseId || this.droppedResponses.has(responseId)) return;
    const reply = this.reply(responseId);
    const wasInFlight = !reply.finished;
    this.droppedResponses.add(responseId);
    if (cancelResponse && wasInFlight) this.connection.send({ type: "response.cancel" });
    const cleared = await this.audio.clear();
    const cutShort = wasInFlight || cleared.droppedSamples > 0;
    if (!cutShort) return; // it had been heard in full: nothing to take back
    for (const item of cleared.items) {
      if (item.itemId !== reply.itemId) continue;
      if (cancelResponse || reply.finished) this.truncate(item.itemId, item.playedSamples);
      else this.heardWhenPaused.set(responseId, { itemId: item.itemId, playedSamples: item.playedSamples });
    }
    reply.interrupted = true;
    voiceStats.interruptions += 1;
    this.playing = false;
    this.view.renderReply(reply);
    this.updateState();
  }

  truncate(itemId, playedSamples) {
    if (this.truncatedItems.has(itemId)) return;
    this.truncatedItems.add(itemId);
    const audioEndMs = Math.floor((playedSamples * 1000) / WIRE_RATE);
    voiceStats.lastTruncateMs = audioEndMs;
    this.connection.send({ type: "conversation.item.truncate", item_id: itemId, content_index: 0, audio_end_ms: audioEndMs });
  }

  onItemTruncated(event) {
    const reply = this.replyForItem(event.item_id);
    if (!reply) return;
    // The server may truncate first with its own estimate (wall clock since the first audio it
    // sent; it cannot see this page's buffer), then confirms the page's exact count: last wins.
    reply.heardMs = event.audio_end_ms; // the server now keeps only what was heard
    this.view.renderReply(reply);
  }

  onOutputAudioCleared() {
    this.bargeIn({ cancelResponse: false });
  }

  onOutputAudioStarted(event) {
    // A paused reply resumes (the sound over it held no words): its audio plays again.
    const responseId = event.response_id;
    if (!responseId || responseId !== this.currentResponseId || !this.droppedResponses.has(responseId)) return;
    this.droppedResponses.delete(responseId);
    this.heardWhenPaused.delete(responseId);
    const reply = this.reply(responseId);
    reply.interrupted = false;
    voiceStats.resumes += 1;
    this.view.renderReply(reply);
  }

  // ---- state and feedback --------------------------------------------------

  updateState() {
    const state = this.currentState();
    voiceStats.state = state;
    if (document.body.dataset.state === state) return;
    document.body.dataset.state = state;
    $("state").textContent = STATE_LABELS[state];
  }

  currentState() {
    if (!this.connection.isOpen || !this.audio.playbackReady) return "idle";
    if (this.userSpeaking) return "user-speaking";
    const current = this.currentResponseId && this.replies.get(this.currentResponseId);
    const replyAudioPending = current && !this.droppedResponses.has(current.responseId) && current.receivedSamples > 0 && !current.finished;
    if (this.playing || (replyAudioPending && this.awaitingReplyAt === null)) return "speaking";
    if (this.awaitingReplyAt !== null || this.replyInFlight()) return "thinking";
    return "listening";
  }

  showLatestMetrics(reply) {
    const latency = reply.metrics && reply.metrics.speech_stopped_to_first_audio_ms;
    $("latency").textContent = latency != null ? `${Math.round(latency)} ms` : reply.heardAfterMs != null ? `${Math.round(reply.heardAfterMs)} ms` : "–";
    const tokens = voiceStats.lastTokensPerForward;
    $("tokens-per-forward").textContent = tokens != null ? Number(tokens).toFixed(1) : "–";
  }

  onErrorEvent(event) {
    const error = event.error || {};
    const where = error.param ? ` (${error.param})` : "";
    const message = `${error.message || "The server reported an error."}${where}`;
    if (this.settingsPending) {  // the session.updated that follows a refusal must not read "applied"
      this.settingsPending = false;
      $("settings-status").textContent = `refused: ${message}`;
    }
    voiceStats.errors.push(message);
    this.showError(message);
    // A turn the server refused to answer will not produce a reply to wait for.
    if (!this.replyInFlight()) this.awaitingReplyAt = null;
  }

  showError(message, kind = "server") {
    const banner = $("error-banner");
    banner.dataset.kind = kind;
    $("error-text").textContent = message;
    banner.hidden = false;
  }

  hideError(kind) {
    const banner = $("error-banner");
    if (kind && banner.dataset.kind !== kind) return;
    banner.hidden = true;
  }
}

const STATE_LABELS = {
  idle: "idle",
  listening: "listening",
  "user-speaking": "hearing you",
  thinking: "thinking",
  speaking: "speaking",
};

const SERVER_EVENT_HANDLERS = {
  "session.created": VoicePage.prototype.onSessionShape,
  "session.updated": VoicePage.prototype.onSessionShape,
  "input_audio_buffer.speech_started": VoicePage.prototype.onSpeechStarted,
  "input_audio_buffer.speech_stopped": VoicePage.prototype.onSpeechStopped,
  "conversation.item.input_audio_transcription.delta": VoicePage.prototype.onTranscriptionDelta,
  "x_input_audio_transcription.partial": VoicePage.prototype.onTranscriptionPartial,
  "conversation.item.input_audio_transcription.completed": VoicePage.prototype.onTranscriptionCompleted,
  "response.created": VoicePage.prototype.onResponseCreated,
  "x_response.draft": VoicePage.prototype.onDraft,
  "response.output_audio.delta": VoicePage.prototype.onAudioDelta,
  "response.output_audio.done": VoicePage.prototype.onAudioDone,
  "response.output_audio_transcript.delta": VoicePage.prototype.onAudioTranscriptDelta,
  "response.output_audio_transcript.done": VoicePage.prototype.onAudioTranscriptDone,
  "response.done": VoicePage.prototype.onResponseDone,
  "output_audio_buffer.cleared": VoicePage.prototype.onOutputAudioCleared,
  "output_audio_buffer.started": VoicePage.prototype.onOutputAudioStarted,
  "conversation.item.truncated": VoicePage.prototype.onItemTruncated,
  "x_turn.metrics": VoicePage.prototype.onTurnMetrics,
  error: VoicePage.prototype.onErrorEvent,
};

new VoicePage().start();
