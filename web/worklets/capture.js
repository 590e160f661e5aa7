// Microphone capture on the audio thread: converts the context's float audio to the
// session's wire format (PCM16 mono 24 kHz) and posts one frame every FRAME_MS.
// The context normally already runs at 24 kHz; when a browser refuses that (Firefox
// with a mic at another rate), the frames are resampled here by linear interpolation.

const WIRE_RATE = 24000;
const FRAME_MS = 20;
const FRAME_SAMPLES = (WIRE_RATE * FRAME_MS) / 1000;

class CaptureProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.muted = false;
    // Input samples advanced per wire sample (2 for a 48 kHz context, 1 at 24 kHz).
    this.step = sampleRate / WIRE_RATE;
    this.position = 0; // read position into `pending`, in input samples
    this.pending = new Float32Array(0); // input not yet consumed by the resampler
    this.frame = new Int16Array(FRAME_SAMPLES);
    this.frameFill = 0;
    this.port.onmessage = (event) => {
      if (event.data.type === "mute") this.muted = Boolean(event.data.muted);
    };
  }

  process(inputs) {
    const channels = inputs[0];
    // No input connected yet (or the track ended): nothing to send.
    if (!channels || channels.length === 0) return true;
    const mono = this.mixToMono(channels);
    if (this.step === 1) {
      for (let i = 0; i < mono.length; i++) this.pushSample(mono[i]);
    } else {
      this.resample(mono);
    }
    return true;
  }

  mixToMono(channels) {
    if (channels.length === 1) return channels[0];
    const mono = new Float32Array(channels[0].length);
    for (const channel of channels) {
      for (let i = 0; i < mono.length; i++) mono[i] += channel[i] / channels.length;
    }
    return mono;
  }

  resample(input) {
    const joined = new Float32Array(this.pending.length + input.length);
    joined.set(this.pending);
    joined.set(input, this.pending.length);
    // Interpolate between neighbours; stop where the right neighbour is not here yet.
    while (this.position + 1 < joined.length) {
      const left = Math.floor(this.position);
      const fraction = this.position - left;
      this.pushSample(joined[left] * (1 - fraction) + joined[left + 1] * fraction);
      this.position += this.step;
    }
    const keepFrom = Math.floor(this.position);
    this.pending = joined.slice(keepFrom);
    this.position -= keepFrom;
  }

  pushSample(value) {
    // Muted still sends silence, so the server's clock and its VAD keep running.
    const clipped = this.muted ? 0 : Math.max(-1, Math.min(1, value));
    this.frame[this.frameFill++] = clipped < 0 ? clipped * 0x8000 : clipped * 0x7fff;
    if (this.frameFill === FRAME_SAMPLES) {
      this.port.postMessage({ type: "frame", pcm16: this.frame.buffer }, [this.frame.buffer]);
      this.frame = new Int16Array(FRAME_SAMPLES);
      this.frameFill = 0;
    }
  }
}

registerProcessor("capture-processor", CaptureProcessor);
