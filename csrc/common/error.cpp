#include "common/error.h"

#include <cstdio>

#include <cstring>

namespace torchrpc::common {

namespace {
std::string fullText(const std::string& message, const std::string& remoteType,
                     const std::string& remoteTraceback) {
  std::string text = remoteType.empty() ? message : remoteType + ": " + message;
  if (!remoteTraceback.empty()) {
    text += "\nRemote traceback:\n" + remoteTraceback;
  }
  return text;
}
}  // namespace

RpcError::RpcError(ErrorKind kind, std::string message, std::string remoteType,
                   std::string remoteTraceback)
    : c10::Error(fullText(message, remoteType, remoteTraceback), /*backtrace=*/nullptr),
      kind_(kind),
      message_(std::move(message)),
      remoteType_(std::move(remoteType)),
      remoteTraceback_(std::move(remoteTraceback)) {}

std::exception_ptr makeRpcError(ErrorKind kind, std::string message,
                                std::string remoteType,
                                std::string remoteTraceback) {
  return std::make_exception_ptr(RpcError(kind, std::move(message),
                                          std::move(remoteType),
                                          std::move(remoteTraceback)));
}

ErrorParts errorParts(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const RpcError& e) {
    return {e.kind(), e.message(), e.remoteType(), e.remoteTraceback()};
  } catch (const c10::Error& e) {
    return {ErrorKind::kGeneric, e.what_without_backtrace()};
  } catch (const std::exception& e) {
    return {ErrorKind::kGeneric, e.what()};
  } catch (...) {
    return {ErrorKind::kGeneric, "unknown error"};
  }
}

std::string errnoMessage(const char* what, int err) {
  char buf[256];
  const char* text = strerror_r(err, buf, sizeof(buf));
  return std::string(what) + ": " + text + " (errno " + std::to_string(err) + ")";
}

std::string secondsText(double seconds, int decimals) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, seconds);
  return buf;
}

}  // namespace torchrpc::common
