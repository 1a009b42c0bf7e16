#include "common/private_directory.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cserps {

absl::Status CreateParentDirectory(const std::string& path) {
  const std::filesystem::path target(path);
  if (!target.has_parent_path()) return absl::OkStatus();
  const std::string dir = target.parent_path().string();
  std::error_code error;
  const bool created = std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::Status(absl::ErrnoToStatusCode(error.value()),
                        absl::StrCat(path, ": create_directories(", dir, "): ", error.message()));
  }
  if (created) {
    std::filesystem::permissions(dir, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::replace, error);
    if (error) {
      return absl::Status(absl::ErrnoToStatusCode(error.value()),
                          absl::StrCat(path, ": chmod 0700 ", dir, ": ", error.message()));
    }
  }
  // One that existed may be another user's, made first to take the place of
  // this job's socket or file and read what the local ranks send.
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0) {
    return absl::Status(absl::ErrnoToStatusCode(errno),
                        absl::StrCat(path, ": lstat(", dir, "): ", std::strerror(errno)));
  }
  const auto refuse = [&](const std::string& why) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": directory ", dir, " ", why,
                     ": remove it, or choose a directory of this user's own"));
  };
  if (S_ISLNK(st.st_mode)) return refuse("is a symbolic link");
  if (!S_ISDIR(st.st_mode)) return refuse("is not a directory");
  if (st.st_uid != geteuid()) {
    return refuse(absl::StrCat("belongs to uid ", st.st_uid, ", not to this user (uid ",
                               geteuid(), ")"));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return refuse(absl::StrFormat("has mode %04o: other users may write to it",
                                  st.st_mode & 07777));
  }
  return absl::OkStatus();
}

}  // namespace cserps
