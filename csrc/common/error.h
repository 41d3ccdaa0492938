#pragma once

// Errors that cross threads travel as values: a future is completed with an
// RpcError (a c10::Error, so TorchScript and C++ callers can catch it as usual)
// that also carries a machine-readable kind. The Python layer turns the kind into
// the matching class of torchrpc.errors; nothing else parses messages.

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace torchrpc::common {

// Numbers are part of the Python binding (errors.py maps them); never renumber.
enum class ErrorKind : int {
  kGeneric = 0,          // an RpcError with no more specific class
  kTimeout = 1,          // the deadline of a call passed before its response came
  kPeerUnreachable = 2,  // the connection to the peer failed or closed
  kRemote = 3,           // the callee raised; remoteType/remoteTraceback are set
  kShutdown = 4,         // the local agent shut down before the call completed
  kInvalidArgument = 5,  // the call was refused before anything was sent (ValueError)
};

class RpcError : public c10::Error {
 public:
  RpcError(ErrorKind kind, std::string message, std::string remoteType = "",
           std::string remoteTraceback = "");

  ErrorKind kind() const { return kind_; }
  // The bare message, without the remote traceback appended to what().
  const std::string& message() const { return message_; }
  const std::string& remoteType() const { return remoteType_; }
  const std::string& remoteTraceback() const { return remoteTraceback_; }

 private:
  ErrorKind kind_;
  std::string message_;
  std::string remoteType_;
  std::string remoteTraceback_;
};

std::exception_ptr makeRpcError(ErrorKind kind, std::string message,
                                std::string remoteType = "",
                                std::string remoteTraceback = "");

// The parts of the error an exception_ptr holds: an RpcError's own, or
// kGeneric with the text of any other exception.
struct ErrorParts {
  ErrorKind kind{ErrorKind::kGeneric};
  std::string message;
  std::string remoteType;
  std::string remoteTraceback;
};
ErrorParts errorParts(const std::exception_ptr& error);

// A failure as a value; empty (false) on success. The transport reports its
// errors this way and never throws.
class Error {
 public:
  enum class Code {
    kNone,
    kInvalid,  // the message cannot be sent at all (e.g. a tensor the wire refuses)
    kClosed,   // the connection is closed
    kTimeout,  // the deadline passed
    kIo,       // the operating system refused (connect, read, write)
  };

  Error() = default;
  Error(Code code, std::string what) : code_(code), what_(std::move(what)) {}

  explicit operator bool() const { return code_ != Code::kNone; }
  Code code() const { return code_; }
  const std::string& what() const { return what_; }

 private:
  Code code_{Code::kNone};
  std::string what_;
};

// A value, or the error that prevented it.
template <typename T>
struct Fallible {
  T value{};
  Error error;
};

// errno as text, for transport errors: "connect: Connection refused (errno 111)".
std::string errnoMessage(const char* what, int err);

// Seconds for a message, with `decimals` digits: "0.50".
std::string secondsText(double seconds, int decimals = 2);

}  // namespace torchrpc::common
