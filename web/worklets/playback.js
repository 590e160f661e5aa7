// Assistant audio playback on the audio thread: a ring buffer of 24 kHz samples that the
// render callback drains, so chunks from the socket play back to back with no gaps.
//
// Messages in:  {type: "audio", itemId, pcm16}   queue one chunk of an assistant item
//               {type: "end", itemId}            no more audio will come for this item
//               {type: "clear", requestId}       drop everything queued (barge-in)
// Messages out: {type: "progress", ...}          what has been played, for the page
//               {type: "cleared", requestId, items}  how much of each item was heard
//
// Positions are absolute sample counts at the wire rate, so "how much of item X was
// played" is a subtraction, whatever the ring's size.

const WIRE_RATE = 24000;
const INITIAL_CAPACITY = WIRE_RATE * 30;
// Wait for this much audio before starting (or restarting after an underrun), so a
// slightly late chunk does not cut the speech into pieces.
const PRIME_SAMPLES = (WIRE_RATE * 80) / 1000;
// On clear, the last quantum fades out instead of stopping dead (which clicks).
const FADE_FRAMES = 128;
const PROGRESS_EVERY_QUANTA = 8;

class PlaybackProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.ring = new Float32Array(INITIAL_CAPACITY);
    this.written = 0; // absolute wire samples ever queued
    this.readPosition = 0; // absolute wire position of the play head (fractional)
    this.step = WIRE_RATE / sampleRate; // wire samples per output frame
    this.items = []; // [{itemId, start, end}] in queue order, absolute positions
    this.endedItems = new Set();
    this.primed = false;
    this.fadeFramesLeft = 0;
    this.playedTotal = 0; // wire samples of assistant audio actually rendered
    this.wasPlaying = false;
    this.quantaSinceProgress = 0;
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  onMessage(message) {
    if (message.type === "audio") this.enqueue(message.itemId, new Int16Array(message.pcm16));
    else if (message.type === "end") this.endedItems.add(message.itemId);
    else if (message.type === "clear") this.clear(message.requestId);
  }

  enqueue(itemId, pcm16) {
    this.ensureCapacity(pcm16.length);
    for (let i = 0; i < pcm16.length; i++) {
      this.ring[(this.written + i) % this.ring.length] = pcm16[i] / 0x8000;
    }
    const last = this.items[this.items.length - 1];
    if (last && last.itemId === itemId && last.end === this.written) last.end += pcm16.length;
    else this.items.push({ itemId, start: this.written, end: this.written + pcm16.length });
    this.written += pcm16.length;
  }

  ensureCapacity(incoming) {
    const liveStart = Math.floor(this.readPosition);
    const needed = this.written - liveStart + incoming + 2;
    if (needed <= this.ring.length) return;
    // Rare: a reply longer than the ring arrived faster than it plays. Grow, keeping
    // each live sample at the same absolute position modulo the new size.
    const grown = new Float32Array(Math.max(needed, this.ring.length * 2));
    for (let position = liveStart; position < this.written; position++) {
      grown[position % grown.length] = this.ring[position % this.ring.length];
    }
    this.ring = grown;
  }

  clear(requestId) {
    const head = Math.floor(this.readPosition);
    // Every item still tracked, including one wholly played while its reply is still being
    // generated (an underrun): the page truncates the reply to what was heard either way.
    const items = this.items.map((item) => ({
      itemId: item.itemId,
      playedSamples: Math.max(0, Math.min(head, item.end) - item.start),
      receivedSamples: item.end - item.start,
    }));
    const queued = this.written - head;
    // Keep only what the fade-out needs; everything else is dropped right now.
    if (this.isPlaying()) {
      this.written = Math.min(this.written, head + Math.ceil(FADE_FRAMES * this.step) + 1);
      this.fadeFramesLeft = FADE_FRAMES;
    } else {
      this.written = head;
    }
    this.items = [];
    this.port.postMessage({ type: "cleared", requestId, items, droppedSamples: queued });
  }

  queuedSamples() {
    return this.written - this.readPosition;
  }

  isPlaying() {
    return this.primed && this.queuedSamples() > 0;
  }

  lastItemEnded() {
    const last = this.items[this.items.length - 1];
    return last !== undefined && this.endedItems.has(last.itemId);
  }

  process(_inputs, outputs) {
    const output = outputs[0];
    const frames = output[0].length;
    if (!this.primed) {
      this.primed = this.queuedSamples() >= PRIME_SAMPLES || (this.queuedSamples() > 0 && this.lastItemEnded());
    }
    for (let frame = 0; frame < frames; frame++) {
      output[0][frame] = this.primed ? this.nextSample() : 0;
    }
    for (let channel = 1; channel < output.length; channel++) output[channel].set(output[0]);
    this.reportProgress();
    return true;
  }

  nextSample() {
    const left = Math.floor(this.readPosition);
    // Linear interpolation needs the right neighbour too unless the rates match.
    const needed = this.step === 1 ? left + 1 : left + 2;
    if (needed > this.written) {
      this.primed = false; // underrun: wait for the buffer to fill again
      this.fadeFramesLeft = 0;
      return 0;
    }
    const fraction = this.readPosition - left;
    let sample = this.ring[left % this.ring.length];
    if (fraction > 0) sample += (this.ring[(left + 1) % this.ring.length] - sample) * fraction;
    if (this.fadeFramesLeft > 0) {
      sample *= this.fadeFramesLeft / FADE_FRAMES;
      this.fadeFramesLeft -= 1;
      // Fade done: skip the few samples kept for it, the queue is now empty.
      this.readPosition = this.fadeFramesLeft === 0 ? this.written : this.readPosition + this.step;
      return sample;
    }
    this.playedTotal += this.step;
    this.readPosition += this.step;
    return sample;
  }

  reportProgress() {
    const playing = this.isPlaying();
    this.quantaSinceProgress += 1;
    if (playing === this.wasPlaying && this.quantaSinceProgress < PROGRESS_EVERY_QUANTA) return;
    this.quantaSinceProgress = 0;
    this.wasPlaying = playing;
    const head = Math.floor(this.readPosition);
    const current = this.items.find((item) => item.end > head) || this.items[this.items.length - 1];
    this.port.postMessage({
      type: "progress",
      playing,
      playedTotal: Math.round(this.playedTotal),
      queuedSamples: Math.max(0, Math.round(this.queuedSamples())),
      itemId: current ? current.itemId : null,
      itemPlayedSamples: current ? Math.max(0, Math.min(head, current.end) - current.start) : 0,
    });
    // Items wholly behind the play head are finished; forget them.
    while (this.items.length > 1 && this.items[0].end <= head) {
      this.endedItems.delete(this.items[0].itemId);
      this.items.shift();
    }
  }
}

registerProcessor("playback-processor", PlaybackProcessor);
