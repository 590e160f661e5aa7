// The page's audio: one AudioContext at the wire rate (24 kHz) with two worklets,
// microphone capture and assistant playback. The socket never touches audio nodes;
// it hands PCM16 chunks here and gets PCM16 frames back.

export const WIRE_RATE = 24000;

const MIC_CONSTRAINTS = {
  audio: {
    channelCount: 1,
    // The browser's echo canceller keeps the assistant's own voice out of the mic,
    // otherwise it would interrupt itself.
    echoCancellation: true,
    noiseSuppression: true,
    autoGainControl: true,
  },
};

export class AudioIO {
  /**
   * @param {{onFrame: (pcm16: ArrayBuffer) => void, onProgress: (progress: object) => void}} handlers
   */
  constructor({ onFrame, onProgress }) {
    this.onFrame = onFrame;
    this.onProgress = onProgress;
    this.context = null;
    this.playbackNode = null;
    this.captureNode = null;
    this.micStream = null;
    this.pendingClears = new Map();
    this.nextClearId = 1;
  }

  get playbackReady() {
    return this.playbackNode !== null;
  }

  get micActive() {
    return this.captureNode !== null;
  }

  /** Create the context and the playback worklet. Must follow a user gesture. */
  async startPlayback() {
    if (this.playbackNode) {
      await this.context.resume();
      return;
    }
    this.context = new AudioContext({ sampleRate: WIRE_RATE, latencyHint: "interactive" });
    await this.context.audioWorklet.addModule(new URL("worklets/playback.js", import.meta.url));
    this.playbackNode = new AudioWorkletNode(this.context, "playback-processor", {
      numberOfInputs: 0,
      outputChannelCount: [1],
    });
    this.playbackNode.port.onmessage = (event) => this.onPlaybackMessage(event.data);
    this.playbackNode.connect(this.context.destination);
    await this.context.resume();
  }

  /** Ask for the microphone and start streaming frames. Throws if the user says no. */
  async startMicrophone() {
    if (this.captureNode) return;
    await this.startPlayback();
    this.micStream = await navigator.mediaDevices.getUserMedia(MIC_CONSTRAINTS);
    const context = await this.captureContext();
    const source = context.createMediaStreamSource(this.micStream);
    this.captureNode = new AudioWorkletNode(context, "capture-processor", {
      numberOfInputs: 1,
      numberOfOutputs: 0,
      channelCount: 1,
      channelCountMode: "explicit",
    });
    this.captureNode.port.onmessage = (event) => {
      if (event.data.type === "frame") this.onFrame(event.data.pcm16);
    };
    source.connect(this.captureNode);
  }

  async captureContext() {
    await this.context.audioWorklet.addModule(new URL("worklets/capture.js", import.meta.url));
    try {
      // Probe: some browsers cannot feed a mic at 48 kHz into a 24 kHz context.
      this.context.createMediaStreamSource(this.micStream).disconnect();
      return this.context;
    } catch (error) {
      if (error.name !== "NotSupportedError") throw error;
      const native = new AudioContext({ latencyHint: "interactive" });
      await native.audioWorklet.addModule(new URL("worklets/capture.js", import.meta.url));
      await native.resume();
      return native; // the capture worklet resamples to 24 kHz itself
    }
  }

  setMuted(muted) {
    if (this.captureNode) this.captureNode.port.postMessage({ type: "mute", muted });
  }

  /** Queue one chunk of assistant audio for an item. */
  enqueue(itemId, pcm16) {
    if (!this.playbackNode) return;
    this.playbackNode.port.postMessage({ type: "audio", itemId, pcm16: pcm16.buffer }, [pcm16.buffer]);
  }

  /** No more audio is coming for this item: play its tail even if shorter than the prebuffer. */
  endItem(itemId) {
    if (this.playbackNode) this.playbackNode.port.postMessage({ type: "end", itemId });
  }

  /**
   * Drop all queued audio. Resolves with how much of each unfinished item was played.
   * @returns {Promise<{items: {itemId: string, playedSamples: number, receivedSamples: number}[], droppedSamples: number}>}
   */
  clear() {
    if (!this.playbackNode) return Promise.resolve({ items: [], droppedSamples: 0 });
    const requestId = this.nextClearId++;
    return new Promise((resolve) => {
      this.pendingClears.set(requestId, resolve);
      this.playbackNode.port.postMessage({ type: "clear", requestId });
    });
  }

  onPlaybackMessage(message) {
    if (message.type === "progress") {
      this.onProgress(message);
    } else if (message.type === "cleared") {
      const resolve = this.pendingClears.get(message.requestId);
      this.pendingClears.delete(message.requestId);
      if (resolve) resolve(message);
    }
  }
}

/** Base64 of little-endian PCM16 bytes, as `input_audio_buffer.append.audio` wants. */
export function pcm16ToBase64(buffer) {
  const bytes = new Uint8Array(buffer);
  let binary = "";
  const chunk = 0x8000; // keep String.fromCharCode's argument list bounded
  for (let i = 0; i < bytes.length; i += chunk) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + chunk));
  }
  return btoa(binary);
}

/** Decode `response.output_audio.delta` audio into PCM16 samples. */
export function base64ToPcm16(text) {
  const binary = atob(text);
  if (binary.length % 2 !== 0) throw new Error(`audio delta has an odd byte count (${binary.length}); PCM16 needs whole samples`);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return new Int16Array(bytes.buffer);
}
