// fluxd's log format for Node processes (docs/logging.md): one line per event,
//
//   2026-11-24T00:21:07.123Z warning fluxbus.store: store 'todos': registration refused (...) key=value k="a b"
//
// the time in UTC with milliseconds, the level (trace, debug, info, notice, warning, error, critical), the label,
// `:`, the message (a newline in it written `\n`: one event, one line), then the metadata as `key=value` sorted by
// key, a value quoted as a JSON string when it is empty or has a space, a control character, `"` or `=`.
// The library's own lines (a Store's default `onError`, label `fluxbus.store`) are written so; an application
// logs its own the same way with `createLogger(label)`. As with fluxd and the other SDKs: `FLUXBUS_LOG_LEVEL`
// (default info), `FLUXBUS_LOG_FORMAT` (text, or json: one object per line), `FLUXBUS_LOG_TIME=0` (fluxd sets it
// for the workers it starts, whose lines it logs with its own time: the line starts with the level), and under
// systemd's journal (`JOURNAL_STREAM` names stderr) `<PRIORITY>label: ...` instead of the time and level.
import fs from 'node:fs';
import { inspect } from 'node:util';

/** fluxd's level names, lowest first. */
export const LOG_LEVELS = Object.freeze(['trace', 'debug', 'info', 'notice', 'warning', 'error', 'critical']);
const PRIORITY = { trace: 7, debug: 7, info: 6, notice: 5, warning: 4, error: 3, critical: 2 };

/** Newlines and other control characters escaped, as fluxd writes a message. @param {string} text */
function oneLine(text) {
  // eslint-disable-next-line no-control-regex
  return text.replace(/[\x00-\x1f]/g, (c) => (c === '\n' ? '\\n' : c === '\r' ? '\\r' : c === '\t' ? '\\t' : `\\u{${c.charCodeAt(0).toString(16)}}`));
}

/** A JSON string escaped exactly as fluxd escapes one (`"`, `\`, \n, \r, \t, other controls as \u00XX). @param {string} text */
function jsonString(text) {
  // eslint-disable-next-line no-control-regex
  return `"${text.replace(/["\\\x00-\x1f]/g, (c) => (c === '"' ? '\\"' : c === '\\' ? '\\\\' : c === '\n' ? '\\n' : c === '\r' ? '\\r' : c === '\t' ? '\\t' : `\\u00${c.charCodeAt(0).toString(16).padStart(2, '0')}`))}"`;
}

/** A metadata value as text: strings as they are, arrays and objects as JSON, others with String(). */
function valueText(value) {
  if (typeof value === 'string') return value;
  if (value !== null && typeof value === 'object' && !(value instanceof Error)) {
    try { return JSON.stringify(value); } catch { return inspect(value); }
  }
  return String(value);
}

/** A metadata value in a text line: bare, or quoted when empty or it has spaces, controls, `"` or `=`. */
function textValue(value) {
  const text = valueText(value);
  // eslint-disable-next-line no-control-regex
  return text !== '' && !/[\x00-\x20"=]/.test(text) ? text : jsonString(text);
}

/** A metadata value in a JSON line: arrays and plain objects as JSON (keys sorted), anything else as a string. */
function jsonValue(value) {
  if (Array.isArray(value)) return `[${value.map(jsonValue).join(',')}]`;
  if (value !== null && typeof value === 'object' && Object.getPrototypeOf(value) === Object.prototype) {
    return `{${Object.keys(value).sort().map((k) => `${jsonString(k)}:${jsonValue(value[k])}`).join(',')}}`;
  }
  return jsonString(valueText(value));
}

/** Sorted as fluxd sorts metadata keys (by UTF-16 code units, which for the usual ASCII keys is byte order). */
const sortedKeys = (metadata) => Object.keys(metadata ?? {}).filter((k) => metadata[k] !== undefined).sort();

/**
 * One line in fluxd's format, without the newline. `time`: ms since the epoch (default now); `format`: 'text' or
 * 'json'; `timestamps: false`: a text line starts with the level (a worker under fluxd); `journald`: a text line
 * starts with `<PRIORITY>` instead of the time and level, a JSON line carries `priority`.
 * @param {string} level one of LOG_LEVELS @param {string} label @param {string} message
 * @param {Record<string, unknown>} [metadata]
 * @param {{time?: number, format?: 'text'|'json', timestamps?: boolean, journald?: boolean}} [options]
 */
export function formatLogLine(level, label, message, metadata = {}, { time = Date.now(), format = 'text', timestamps = true, journald = false } = {}) {
  if (!LOG_LEVELS.includes(level)) throw new TypeError(`unknown log level ${JSON.stringify(level)}: one of ${LOG_LEVELS.join(', ')}`);
  const keys = sortedKeys(metadata);
  const stamp = new Date(time).toISOString();
  if (format === 'json') {
    let line = `{"time":"${stamp}","level":"${level}","label":${jsonString(label)},"message":${jsonString(String(message))}`;
    if (journald) line += `,"priority":${PRIORITY[level]}`;
    if (keys.length) line += `,"metadata":{${keys.map((k) => `${jsonString(k)}:${jsonValue(metadata[k])}`).join(',')}}`;
    return `${line}}`;
  }
  if (format !== 'text') throw new TypeError(`unknown log format ${JSON.stringify(format)}: text or json`);
  let line = journald ? `<${PRIORITY[level]}>${label}: ` : timestamps ? `${stamp} ${level} ${label}: ` : `${level} ${label}: `;
  line += oneLine(String(message));
  for (const k of keys) line += ` ${k}=${textValue(metadata[k])}`;
  return line;
}

/** Whether stderr is systemd's journal: `JOURNAL_STREAM` names its device and inode (systemd.exec(5)). */
function stderrIsJournal(journalStream) {
  const m = /^(\d+):(\d+)$/.exec(journalStream ?? '');
  if (!m) return false;
  try {
    const st = fs.fstatSync(2, { bigint: true });
    return st.dev === BigInt(m[1]) && st.ino === BigInt(m[2]);
  } catch { return false; }
}

/**
 * What the environment asks for: `FLUXBUS_LOG_LEVEL` (default info), `FLUXBUS_LOG_FORMAT` (default text),
 * `FLUXBUS_LOG_TIME=0` (no time), `JOURNAL_STREAM` (stderr is the journal).
 * @param {Record<string, string|undefined>} [env]
 */
export function logSettings(env = process.env) {
  const level = (env.FLUXBUS_LOG_LEVEL ?? '').trim().toLowerCase();
  const format = env.FLUXBUS_LOG_FORMAT === 'json' ? 'json' : 'text';
  return {
    level: /** @type {any} */ (LOG_LEVELS.includes(level) ? level : 'info'),
    format: /** @type {'text'|'json'} */ (format),
    timestamps: env.FLUXBUS_LOG_TIME !== '0',
    journald: stderrIsJournal(env.JOURNAL_STREAM),
  };
}

/**
 * A logger for `label` writing fluxd's lines: `log.info(message, metadata)`, one method per level, and
 * `log.log(level, message, metadata)`. Lines below `level` are dropped. Options default to `logSettings()`;
 * `write` (default: stderr) receives each line with its newline, `clock` gives the time in ms (tests).
 * @param {string} label
 * @param {{level?: string, format?: 'text'|'json', timestamps?: boolean, journald?: boolean,
 *          write?: (line: string) => void, clock?: () => number}} [options]
 */
export function createLogger(label, options = {}) {
  const settings = { ...logSettings(), ...Object.fromEntries(Object.entries(options).filter(([, v]) => v !== undefined)) };
  if (!LOG_LEVELS.includes(settings.level)) throw new TypeError(`unknown log level ${JSON.stringify(settings.level)}: one of ${LOG_LEVELS.join(', ')}`);
  const threshold = LOG_LEVELS.indexOf(settings.level);
  const write = options.write ?? ((line) => { process.stderr.write(line); });
  const clock = options.clock ?? Date.now;
  const log = (level, message, metadata) => {
    if (LOG_LEVELS.indexOf(level) < threshold) return;
    write(`${formatLogLine(level, label, message, metadata, { time: clock(), format: settings.format, timestamps: settings.timestamps, journald: settings.journald })}\n`);
  };
  const logger = { label, level: settings.level, log };
  for (const level of LOG_LEVELS) logger[level] = (message, metadata) => log(level, message, metadata);
  return /** @type {import('./log.d.mts').Logger} */ (logger);
}

/** An error (or anything thrown) as text for a log line: its stack when it has one (escaped into the line). */
export function describeError(error) {
  if (error instanceof Error) return error.stack ?? `${error.name}: ${error.message}`;
  return typeof error === 'string' ? error : inspect(error);
}
