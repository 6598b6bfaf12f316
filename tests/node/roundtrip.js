#!/usr/bin/env node
// A STOMP round trip from Node.js, for mqguard's test suite: a client that is not Python.
//
// Uses @stomp/stompjs (STOMP 1.2, heart-beats, receipts) over a plain TCP socket through
// @stomp/tcp-wrapper. One connection: SEND --count messages (each with a receipt, all
// receipts awaited), then SUBSCRIBE with ack:client-individual, ACK every MESSAGE until
// --count distinct `seq` values were seen, DISCONNECT (with a receipt), and print ONE JSON line:
//
//   {"sent": N, "duplicates_sent": D, "received": [seq, ...in arrival order],
//    "headers_sample": {...headers of the first MESSAGE...}, "errors": [...],
//    "receipts": R, "stomp_version": "1.2"}
//
// Exit 0 on success, 1 on any error (connect failure, ERROR frame, lost connection,
// missing receipt, timeout), 2 on bad arguments.
//
// Message i (1..N) has header seq:i and body "message i". With --dup-ids it also carries
// _AMQ_DUPL_ID:<prefix><i>; --dup-id-every K (implies --dup-ids) resends message i (same
// seq, same _AMQ_DUPL_ID, plus header resend:true) right after every K-th message i, so
// D = floor(N / K) duplicates are sent. A broker keeps them (seq i arrives twice); a
// deduplicating proxy drops them. After N distinct seqs the client keeps receiving for
// --linger-ms (default 1000 with --dup-id-every, else 0) so late duplicates show up.
'use strict';

const { Client } = require('@stomp/stompjs');
const { TCPWrapper } = require('@stomp/tcp-wrapper');

const USAGE = `usage: node roundtrip.js --host H --port P --destination /queue/X --count N
  [--login L --passcode P] [--vhost /] [--heartbeat 1000,1000] [--timeout-ms 20000]
  [--dup-ids] [--dup-id-prefix node-] [--dup-id-every K] [--linger-ms MS] [--verbose]`;

function parseArgs(argv) {
  const opts = {
    host: '127.0.0.1',
    port: null,
    destination: null,
    count: null,
    login: null,
    passcode: null,
    vhost: '/',
    heartbeat: '1000,1000',
    timeoutMs: 20000,
    dupIds: false,
    dupIdPrefix: 'node-',
    dupIdEvery: 0,
    lingerMs: null,
    verbose: false,
  };
  const valued = {
    '--host': ['host', String],
    '--port': ['port', Number],
    '--destination': ['destination', String],
    '--count': ['count', Number],
    '--login': ['login', String],
    '--passcode': ['passcode', String],
    '--vhost': ['vhost', String],
    '--heartbeat': ['heartbeat', String],
    '--timeout-ms': ['timeoutMs', Number],
    '--dup-id-prefix': ['dupIdPrefix', String],
    '--dup-id-every': ['dupIdEvery', Number],
    '--linger-ms': ['lingerMs', Number],
  };
  for (let i = 0; i < argv.length; i++) {
    let arg = argv[i];
    let value;
    const eq = arg.indexOf('=');
    if (arg.startsWith('--') && eq > 0) {
      value = arg.slice(eq + 1);
      arg = arg.slice(0, eq);
    }
    if (arg === '--dup-ids') opts.dupIds = true;
    else if (arg === '--verbose') opts.verbose = true;
    else if (arg === '--help' || arg === '-h') {
      process.stdout.write(USAGE + '\n');
      process.exit(0);
    } else if (valued[arg]) {
      if (value === undefined) {
        if (i + 1 >= argv.length) throw new Error(`${arg} needs a value`);
        value = argv[++i];
      }
      const [key, convert] = valued[arg];
      opts[key] = convert(value);
      if (convert === Number && !Number.isInteger(opts[key])) {
        throw new Error(`${arg} needs an integer, got ${JSON.stringify(value)}`);
      }
    } else {
      throw new Error(`unknown argument ${JSON.stringify(arg)}`);
    }
  }
  if (!opts.port || opts.port < 1) throw new Error('--port is required');
  if (!opts.destination) throw new Error('--destination is required');
  if (opts.count === null || opts.count < 1) throw new Error('--count (>= 1) is required');
  if (opts.dupIdEvery < 0) throw new Error('--dup-id-every must be >= 0');
  if (opts.dupIdEvery > 0) opts.dupIds = true;
  if (opts.lingerMs === null) opts.lingerMs = opts.dupIdEvery > 0 ? 1000 : 0;
  const hb = /^(\d+),(\d+)$/.exec(opts.heartbeat);
  if (!hb) throw new Error('--heartbeat must look like 1000,1000 (outgoing,incoming ms)');
  opts.heartbeatOutgoing = Number(hb[1]);
  opts.heartbeatIncoming = Number(hb[2]);
  return opts;
}

function describeFrame(frame) {
  const message = frame.headers && frame.headers.message;
  const body = (frame.body || '').trim();
  return `ERROR frame: ${message || '(no message header)'}${body ? ` -- ${body}` : ''}`;
}

// Resolves to true when `predicate()` holds (checked on every `state.kick()`), to false on
// timeout; rejects as soon as a fatal error was recorded.
function waitFor(state, predicate, timeoutMs) {
  return new Promise((resolve, reject) => {
    const check = () => {
      if (state.fatal) {
        finish();
        reject(state.fatal);
      } else if (predicate()) {
        finish();
        resolve(true);
      }
    };
    const timer = setTimeout(() => {
      finish();
      resolve(false);
    }, timeoutMs);
    const finish = () => {
      clearTimeout(timer);
      state.waiters.delete(check);
    };
    state.waiters.add(check);
    check();
  });
}

function newState(result) {
  return {
    connected: false,
    closing: false,
    fatal: null,
    waiters: new Set(),
    kick() {
      for (const check of [...this.waiters]) check();
    },
    fail(message) {
      if (!result.errors.includes(message)) result.errors.push(message);
      if (!this.fatal) this.fatal = new Error(message);
      this.kick();
    },
  };
}

function createClient(opts, result, state) {
  const log = opts.verbose ? (msg) => process.stderr.write(`[stomp] ${msg}\n`) : () => {};
  const connectHeaders = { host: opts.vhost };
  if (opts.login !== null) connectHeaders.login = opts.login;
  if (opts.passcode !== null) connectHeaders.passcode = opts.passcode;

  const client = new Client({
    webSocketFactory: () => new TCPWrapper(opts.host, opts.port),
    connectHeaders,
    heartbeatOutgoing: opts.heartbeatOutgoing,
    heartbeatIncoming: opts.heartbeatIncoming,
    reconnectDelay: 0, // no automatic reconnection: a lost connection is an error
    connectionTimeout: opts.timeoutMs,
    debug: log,
  });
  client.onConnect = (frame) => {
    state.connected = true;
    result.stomp_version = frame.headers.version || '1.0';
    state.kick();
  };
  client.onStompError = (frame) => state.fail(describeFrame(frame));
  client.onWebSocketError = (event) => {
    const err = event && event.message;
    state.fail(`socket error: ${err && err.message ? err.message : String(err || event)}`);
  };
  client.onWebSocketClose = () => {
    if (!state.closing) {
      state.fail(state.connected ? 'connection closed by the server'
        : `could not connect to ${opts.host}:${opts.port}`);
    }
  };
  client.onUnhandledReceipt = (frame) => log(`unexpected RECEIPT ${frame.headers['receipt-id']}`);
  return client;
}

async function roundTrip(client, opts, result, state) {
  client.activate();
  if (!(await waitFor(state, () => state.connected, opts.timeoutMs))) {
    throw new Error(`timeout: not connected after ${opts.timeoutMs} ms`);
  }

  // SEND: every frame asks for a receipt; they are pipelined, then awaited together.
  const pending = new Set();
  let receiptCounter = 0;
  const send = (i, resend) => {
    const receipt = `send-${++receiptCounter}`;
    const headers = { seq: String(i), receipt };
    if (opts.dupIds) headers._AMQ_DUPL_ID = `${opts.dupIdPrefix}${i}`;
    if (resend) headers.resend = 'true';
    pending.add(receipt);
    client.watchForReceipt(receipt, () => {
      pending.delete(receipt);
      result.receipts += 1;
      state.kick();
    });
    client.publish({ destination: opts.destination, body: `message ${i}`, headers });
  };
  for (let i = 1; i <= opts.count; i++) {
    send(i, false);
    result.sent += 1;
    if (opts.dupIdEvery > 0 && i % opts.dupIdEvery === 0) {
      send(i, true);
      result.duplicates_sent += 1;
    }
  }
  if (!(await waitFor(state, () => pending.size === 0, opts.timeoutMs))) {
    throw new Error(`timeout: ${pending.size} of ${receiptCounter} receipts missing after `
      + `${opts.timeoutMs} ms (${[...pending].slice(0, 10).join(', ')})`);
  }

  // SUBSCRIBE with client-individual acks; receive until every seq was seen.
  const seen = new Set();
  client.subscribe(opts.destination, (message) => {
    const raw = message.headers.seq;
    const seq = /^\d+$/.test(raw || '') ? Number(raw) : raw === undefined ? null : raw;
    if (result.received.length === 0) result.headers_sample = { ...message.headers };
    result.received.push(seq);
    seen.add(seq);
    message.ack();
    state.kick();
  }, { id: 'node-sub-0', ack: 'client-individual' });
  if (!(await waitFor(state, () => seen.size >= opts.count, opts.timeoutMs))) {
    throw new Error(`timeout: ${seen.size} of ${opts.count} distinct seqs received after `
      + `${opts.timeoutMs} ms`);
  }
  if (opts.lingerMs > 0) {
    // Only a fatal error ends the linger early.
    await waitFor(state, () => false, opts.lingerMs);
  }
}

async function disconnect(client, timeoutMs) {
  // deactivate() sends DISCONNECT with a receipt (so the server has seen every ACK before)
  // and resolves once the socket is closed.
  const done = client.deactivate();
  let timer;
  const timeout = new Promise((resolve) => {
    timer = setTimeout(() => resolve('timeout'), timeoutMs);
  });
  const outcome = await Promise.race([done.then(() => 'ok'), timeout]);
  clearTimeout(timer);
  if (outcome === 'timeout') {
    client.forceDisconnect();
    return `timeout: DISCONNECT not completed after ${timeoutMs} ms`;
  }
  return null;
}

async function main() {
  const result = {
    sent: 0,
    duplicates_sent: 0,
    received: [],
    headers_sample: {},
    errors: [],
    receipts: 0,
    stomp_version: null,
  };
  let opts;
  try {
    opts = parseArgs(process.argv.slice(2));
  } catch (err) {
    result.errors.push(`bad arguments: ${err.message}`);
    process.stderr.write(USAGE + '\n');
    return emit(result, 2);
  }

  const state = newState(result);
  const client = createClient(opts, result, state);
  try {
    await roundTrip(client, opts, result, state);
  } catch (err) {
    if (!result.errors.includes(err.message)) result.errors.push(err.message);
  }
  state.closing = true;
  if (client.connected) {
    const err = await disconnect(client, Math.min(opts.timeoutMs, 5000));
    if (err) result.errors.push(err);
  } else {
    await client.deactivate({ force: true }).catch(() => {});
  }
  return emit(result, result.errors.length ? 1 : 0);
}

function emit(result, code) {
  process.stdout.write(JSON.stringify(result) + '\n', () => process.exit(code));
}

main().catch((err) => {
  emit({ sent: 0, duplicates_sent: 0, received: [], headers_sample: {},
    errors: [`internal error: ${err && err.stack ? err.stack : err}`] }, 1);
});
