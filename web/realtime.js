// The realtime socket: JSON events in and out, and reconnecting with backoff when the
// connection drops. Knows nothing about what the events mean.

const FIRST_RETRY_MS = 500;
const MAX_RETRY_MS = 8000;

// x_events=1: the page shows the server's x_... events (partial transcripts, drafts, turn
// metrics), which the server sends only to clients that ask for them.
export function realtimeUrl(pageLocation) {
  const scheme = pageLocation.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${pageLocation.host}/v1/realtime?x_events=1`;
}

/**
 * Subprotocols for the socket: a server started with an API token is opened as
 * http://HOST:PORT/#token=TOKEN, and the page hands the token over the way the openai SDK does
 * in browsers (the fragment never leaves the browser).
 */
export function realtimeProtocols(pageLocation) {
  const token = new URLSearchParams(pageLocation.hash.slice(1)).get("token");
  return token ? ["realtime", `openai-insecure-api-key.${token}`] : ["realtime"];
}

export class RealtimeConnection {
  /**
   * @param {string} url
   * @param {{onEvent: (event: object) => void, onStatus: (status: string, detail?: string) => void, onOpen: () => void}} handlers
   *   status is one of "connecting", "open", "reconnecting".
   */
  constructor(url, { onEvent, onStatus, onOpen }, protocols = undefined) {
    this.url = url;
    this.protocols = protocols;
    this.onEvent = onEvent;
    this.onStatus = onStatus;
    this.onOpen = onOpen;
    this.socket = null;
    this.retryMs = FIRST_RETRY_MS;
    this.retryTimer = null;
    this.everOpened = false;
  }

  get isOpen() {
    return this.socket !== null && this.socket.readyState === WebSocket.OPEN;
  }

  connect() {
    clearTimeout(this.retryTimer);
    this.onStatus(this.everOpened ? "reconnecting" : "connecting");
    const socket = new WebSocket(this.url, this.protocols);
    this.socket = socket;
    socket.onopen = () => {
      this.retryMs = FIRST_RETRY_MS;
      this.everOpened = true;
      this.onStatus("open");
      this.onOpen();
    };
    socket.onmessage = (message) => this.receive(message.data);
    socket.onclose = (close) => {
      if (this.socket !== socket) return;
      this.socket = null;
      this.scheduleRetry(close.code === 1000 ? "the server closed the session" : `the server cannot be reached (code ${close.code})`);
    };
  }

  scheduleRetry(reason) {
    const delay = this.retryMs;
    this.retryMs = Math.min(this.retryMs * 2, MAX_RETRY_MS);
    this.onStatus("reconnecting", `${reason}; retrying in ${(delay / 1000).toFixed(1)} s`);
    this.retryTimer = setTimeout(() => this.connect(), delay);
  }

  receive(data) {
    let event;
    try {
      event = JSON.parse(data);
    } catch (error) {
      this.onEvent({ type: "error", error: { message: `server sent a message that is not JSON: ${error.message}` } });
      return;
    }
    this.onEvent(event);
  }

  /** Send one client event; returns false (and drops it) while disconnected. */
  send(event) {
    if (!this.isOpen) return false;
    this.socket.send(JSON.stringify(event));
    return true;
  }
}
