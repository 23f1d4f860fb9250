/**
 * The protocol's errors, typed: each code of PROTOCOL.md §11 is an `ErrorCode`, and a refusal
 * from the server is an `RpcError` carrying it (test/client.test.ts fails when this table and
 * `proto-spec/openrpc.json` drift apart).
 */

/** The JSON-RPC error codes of the protocol, by the name the server puts in `data.error`. */
export const ErrorCode = {
  ParseError: -32700,
  InvalidRequest: -32600,
  MethodNotFound: -32601,
  InvalidParams: -32602,
  Internal: -32603,
  BatchNotSupported: -32005,
  TooManySubscriptions: -32006,
  FrameTooLarge: -32007,
  ResponseTooLarge: -32008,
  Unauthenticated: -32001,
  Forbidden: -32002,
  ConversationNotFound: -32003,
  ConversationExists: -32004,
  ConversationClosed: -32010,
  TurnClosed: -32011,
  NotYourTurn: -32012,
  TurnMismatch: -32013,
  InvalidFinality: -32014,
  IdempotencyKeyReused: -32015,
  ConversationPaused: -32016,
  ModeNotSupported: -32017,
  ClaimNotFound: -32020,
  RateLimited: -32029,
  PayloadTooLarge: -32030,
  SubconversationLimit: -32031,
  QuotaExceeded: -32032,
  TenantQuotaExceeded: -32033,
} as const;

/** One of the protocol's error codes. */
export type ErrorCode = (typeof ErrorCode)[keyof typeof ErrorCode];

/** The name of a code (`NotYourTurn`), or undefined for a code this SDK does not know. */
export function errorName(code: number): keyof typeof ErrorCode | undefined {
  return (Object.keys(ErrorCode) as Array<keyof typeof ErrorCode>).find((k) => ErrorCode[k] === code);
}

/** Anything this SDK throws. */
export class OrchestratorError extends Error {
  override name = "OrchestratorError";
}

/**
 * The server refused a call: `code` (one of `ErrorCode`, or a number this SDK does not know),
 * `message` for people, `data` for programs (`currentTurn`, `limit`, `retryAfterMs`, …).
 */
export class RpcError extends OrchestratorError {
  override name = "RpcError";
  constructor(
    readonly code: number,
    readonly rpcMessage: string,
    readonly data?: unknown,
  ) {
    super(`${rpcMessage} (${errorName(code) ?? "unknown code"}, ${code})`);
  }

  /** The error object of a JSON-RPC answer. */
  static fromWire(error: { code?: number; message?: string; data?: unknown }): RpcError {
    return new RpcError(error.code ?? ErrorCode.Internal, String(error.message ?? ""), error.data);
  }
}

/** The client was closed (by `Client.close`) while the call waited, or the stream ended. */
export class ConnectionClosed extends OrchestratorError {
  override name = "ConnectionClosed";
}

/** The server refused the token; reconnecting would not help. */
export class AuthenticationFailed extends OrchestratorError {
  override name = "AuthenticationFailed";
}
