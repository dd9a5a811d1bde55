// Symbols the library's modules use to reach each other's internals without making them public API.
export const kAttach = Symbol('fluxbus.attach');
export const kRelease = Symbol('fluxbus.release');
export const kDeliver = Symbol('fluxbus.deliver');
export const kEnd = Symbol('fluxbus.end');
export const kStatus = Symbol('fluxbus.status');
export const kFirst = Symbol('fluxbus.first');
export const kRebase = Symbol('fluxbus.rebase');
export const kLose = Symbol('fluxbus.lose');
export const kHold = Symbol('fluxbus.hold');
export const kBarrier = Symbol('fluxbus.barrier');
