// Types of log.mjs: fluxd's log format (docs/logging.md).
export type LogLevel = 'trace' | 'debug' | 'info' | 'notice' | 'warning' | 'error' | 'critical';
export type LogFormat = 'text' | 'json';
export type LogMetadata = Record<string, unknown>;

/** fluxd's level names, lowest first. */
export declare const LOG_LEVELS: readonly LogLevel[];

export interface LineOptions {
  /** ms since the epoch (default now). */
  time?: number;
  format?: LogFormat;
  /** false: a text line starts with the level (a worker under fluxd, `FLUXBUS_LOG_TIME=0`). */
  timestamps?: boolean;
  /** systemd's journal: `<PRIORITY>label: ...` (text), `priority` (json). */
  journald?: boolean;
}

/** One line in fluxd's format, without the newline: `2026-11-24T00:21:07.123Z info label: message key=value`. */
export declare function formatLogLine(level: LogLevel, label: string, message: string, metadata?: LogMetadata, options?: LineOptions): string;

export interface LogSettings {
  level: LogLevel;
  format: LogFormat;
  timestamps: boolean;
  journald: boolean;
}

/** `FLUXBUS_LOG_LEVEL`, `FLUXBUS_LOG_FORMAT`, `FLUXBUS_LOG_TIME`, `JOURNAL_STREAM` (stderr is the journal). */
export declare function logSettings(env?: Record<string, string | undefined>): LogSettings;

export interface LoggerOptions extends Partial<LogSettings> {
  /** Receives each line with its newline (default: stderr). */
  write?: (line: string) => void;
  /** The time in ms since the epoch (default Date.now). */
  clock?: () => number;
}

export interface Logger {
  readonly label: string;
  readonly level: LogLevel;
  log(level: LogLevel, message: string, metadata?: LogMetadata): void;
  trace(message: string, metadata?: LogMetadata): void;
  debug(message: string, metadata?: LogMetadata): void;
  info(message: string, metadata?: LogMetadata): void;
  notice(message: string, metadata?: LogMetadata): void;
  warning(message: string, metadata?: LogMetadata): void;
  error(message: string, metadata?: LogMetadata): void;
  critical(message: string, metadata?: LogMetadata): void;
}

/** A logger for `label` writing fluxd's lines at `level` and above (defaults: `logSettings()`). */
export declare function createLogger(label: string, options?: LoggerOptions): Logger;

/** An error (or anything thrown) as text for a log line: its stack when it has one. */
export declare function describeError(error: unknown): string;
