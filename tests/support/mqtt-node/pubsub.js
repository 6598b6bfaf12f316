// Publish and receive through one MQTT endpoint with the npm `mqtt` client, for mqguard's
// MQTT sidecar tests. Usage:
//   node pubsub.js --port P --topic T --count N [--version 4|5] [--dup-id-every K]
// A subscriber (QoS 1) and a publisher connect; the publisher sends N QoS 1 messages
// "m0".."m(N-1)" (MQTT 5: user property `seq`, and with --dup-id-every K the same
// `_AMQ_DUPL_ID` for each run of K messages); the subscriber collects what arrives until
// N messages came or 1 s passed without one. Prints one JSON line:
//   {"received": [payloads], "seq": [user property seq or null], "errors": [...]}
"use strict";
const mqtt = require("mqtt");

function option(name, fallback) {
  const at = process.argv.indexOf(`--${name}`);
  return at >= 0 ? process.argv[at + 1] : fallback;
}

const port = Number(option("port"));
const topic = option("topic");
const count = Number(option("count", "10"));
const version = Number(option("version", "5"));
const dupEvery = Number(option("dup-id-every", "0"));
const url = `mqtt://127.0.0.1:${port}`;
const base = { protocolVersion: version, reconnectPeriod: 0, connectTimeout: 10000 };
const result = { received: [], seq: [], errors: [] };

function finish(code) {
  process.stdout.write(JSON.stringify(result) + "\n");
  process.exit(code);
}

const sub = mqtt.connect(url, { ...base, clientId: `${topic}-npm-sub`.replace(/\//g, "-") });
sub.on("error", (e) => { result.errors.push(String(e)); finish(1); });
let idle = null;
function armIdle() {
  clearTimeout(idle);
  idle = setTimeout(() => finish(0), 1000);
}
sub.on("message", (_topic, payload, packet) => {
  result.received.push(payload.toString());
  const user = (packet.properties && packet.properties.userProperties) || {};
  result.seq.push(user.seq === undefined ? null : String(user.seq));
  if (result.received.length >= count + 5) finish(0);
  armIdle();
});
sub.on("connect", () => {
  sub.subscribe(topic, { qos: 1 }, (err) => {
    if (err) { result.errors.push(String(err)); finish(1); }
    const pub = mqtt.connect(url, { ...base, clientId: `${topic}-npm-pub`.replace(/\//g, "-") });
    pub.on("error", (e) => { result.errors.push(String(e)); finish(1); });
    pub.on("connect", async () => {
      for (let i = 0; i < count; i++) {
        const properties = version === 5 ? { userProperties: { seq: String(i) } } : undefined;
        if (properties && dupEvery > 0) {
          properties.userProperties._AMQ_DUPL_ID = `npm-${topic}-${Math.floor(i / dupEvery)}`;
        }
        try {
          await pub.publishAsync(topic, `m${i}`, { qos: 1, properties });
        } catch (e) {
          result.errors.push(String(e));
        }
      }
      pub.end();
      armIdle();
    });
  });
});
setTimeout(() => { result.errors.push("timed out"); finish(1); }, 30000);
