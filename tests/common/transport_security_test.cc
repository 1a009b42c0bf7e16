// LoadTransportSecurity against the files tools/make_certs.sh makes and
// broken variants of them, the token comparison, and the exposure rule.
#include "common/transport_security.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/openssl_pem.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/job_certificates.h"

namespace cserps {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

class TransportSecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::path(::testing::TempDir()) / absl::StrCat("transport_security_test.", getpid());
    for (const char* job : {"job", "other"}) {
      ASSERT_TRUE(testing::MakeJobCertificates(CSERPS_SOURCE_DIR, (root_ / job).string())) << job;
    }
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static std::string File(const char* job, const char* name) {
    return (root_ / job / name).string();
  }
  static std::string Write(const char* name, const std::string& contents) {
    const std::string path = (root_ / name).string();
    std::ofstream(path) << contents;
    return path;
  }
  static v1::SecurityConfig Tls(const std::string& ca, const std::string& cert,
                                const std::string& key) {
    v1::SecurityConfig config;
    config.set_ca_cert(ca);
    config.set_cert(cert);
    config.set_key(key);
    return config;
  }

  static fs::path root_;
};

fs::path TransportSecurityTest::root_;

TEST_F(TransportSecurityTest, TheFilesOfMakeCertsLoad) {
  v1::SecurityConfig config =
      Tls(File("job", "ca.pem"), File("job", "server.pem"), File("job", "server.key"));
  config.set_token_file(File("job", "token"));
  absl::StatusOr<TransportSecurity> security = LoadTransportSecurity(config, TlsRole::kServer);
  ASSERT_TRUE(security.ok()) << security.status();
  ASSERT_TRUE(security->tls.has_value());
  EXPECT_THAT(security->tls->cert_pem, HasSubstr("BEGIN CERTIFICATE"));
  EXPECT_EQ(security->token.size(), 64u) << "the newline is not part of the token";
  EXPECT_TRUE(security->enabled());

  absl::StatusOr<TransportSecurity> none =
      LoadTransportSecurity(v1::SecurityConfig(), TlsRole::kWorker);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->enabled());
}

TEST_F(TransportSecurityTest, EachBadFileIsNamed) {
  const std::string ca = File("job", "ca.pem");
  const std::string cert = File("job", "client.pem");
  const std::string key = File("job", "client.key");
  const std::string junk = Write("junk.pem", "not a certificate\n");
  struct Case {
    const char* name;
    v1::SecurityConfig config;
    absl::StatusCode code;
    std::vector<std::string> fragments;
  };
  v1::SecurityConfig only_cert;
  only_cert.set_cert(cert);
  const Case cases[] = {
      {"missing", Tls(ca, cert, (root_ / "nowhere.key").string()),
       absl::StatusCode::kNotFound, {"security.key", "nowhere.key", "cannot be read"}},
      {"partial", only_cert, absl::StatusCode::kInvalidArgument,
       {"together", "ca_cert", "key"}},
      {"junk CA", Tls(junk, cert, key), absl::StatusCode::kInvalidArgument,
       {"security.ca_cert", "junk.pem", "no PEM certificate"}},
      {"junk cert", Tls(ca, junk, key), absl::StatusCode::kInvalidArgument,
       {"security.cert", "no PEM certificate"}},
      {"junk key", Tls(ca, cert, junk), absl::StatusCode::kInvalidArgument,
       {"security.key", "private key"}},
      {"another pair's key", Tls(ca, cert, File("job", "server.key")),
       absl::StatusCode::kInvalidArgument, {"security.key", "does not match", "client.pem"}},
      {"another CA's cert",
       Tls(ca, File("other", "client.pem"), File("other", "client.key")),
       absl::StatusCode::kInvalidArgument,
       {"security.cert", "not accepted by security.ca_cert", "local issuer"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<TransportSecurity> security = LoadTransportSecurity(c.config, TlsRole::kWorker);
    EXPECT_EQ(security.status().code(), c.code) << security.status();
    for (const std::string& f : c.fragments) {
      EXPECT_THAT(security.status().message(), HasSubstr(f));
    }
  }
  // Each end's certificate at the other end, which its peer's handshake
  // would refuse.
  const absl::StatusOr<TransportSecurity> server_as_worker = LoadTransportSecurity(
      Tls(ca, File("job", "server.pem"), File("job", "server.key")), TlsRole::kWorker);
  EXPECT_TRUE(absl::IsInvalidArgument(server_as_worker.status())) << server_as_worker.status();
  EXPECT_THAT(server_as_worker.status().message(),
              AllOf(HasSubstr("security.cert"), HasSubstr("server.pem"), HasSubstr("clientAuth")));
  const absl::StatusOr<TransportSecurity> worker_as_server =
      LoadTransportSecurity(Tls(ca, cert, key), TlsRole::kServer);
  EXPECT_TRUE(absl::IsInvalidArgument(worker_as_server.status())) << worker_as_server.status();
  EXPECT_THAT(worker_as_server.status().message(),
              AllOf(HasSubstr("security.cert"), HasSubstr("client.pem"), HasSubstr("serverAuth")));
}

// Another worker's certificate from the job's CA loads; a name that would
// replace the job's own files is refused, and they stay as they were.
TEST_F(TransportSecurityTest, MakeCertsIssuesMoreClientsButNeverOverTheJobsFiles) {
  const auto make_client = [](const std::string& name) {
    const std::string command = absl::StrCat("bash ", CSERPS_SOURCE_DIR,
                                             "/tools/make_certs.sh --client ", name, " ",
                                             (root_ / "job").string(), " > /dev/null 2>&1");
    const int status = std::system(command.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  const auto read = [](const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string ca_key = read(File("job", "ca.key"));
  const std::string server_key = read(File("job", "server.key"));
  for (const char* own : {"ca", "server", "client"}) {
    SCOPED_TRACE(own);
    EXPECT_EQ(make_client(own), 2);
  }
  EXPECT_EQ(read(File("job", "ca.key")), ca_key);
  EXPECT_EQ(read(File("job", "server.key")), server_key);

  ASSERT_EQ(make_client("worker-7"), 0);
  absl::StatusOr<TransportSecurity> security = LoadTransportSecurity(
      Tls(File("job", "ca.pem"), File("job", "worker-7.pem"), File("job", "worker-7.key")),
      TlsRole::kWorker);
  EXPECT_TRUE(security.ok()) << security.status();
  EXPECT_EQ(make_client("worker-7"), 1) << "an existing worker's files are kept";
}

// A set that fails to be made (an IP name that is none) leaves nothing
// behind, so the next run makes a whole one; a set missing a file is
// refused by name instead of kept as complete.
TEST_F(TransportSecurityTest, MakeCertsMakesAWholeSetOrNone) {
  const fs::path dir = root_ / "partial";
  struct Made {
    int exit_code = -1;
    std::string output;
  };
  const auto make = [&dir](const std::string& names) {
    const std::string command = absl::StrCat("bash ", CSERPS_SOURCE_DIR, "/tools/make_certs.sh ",
                                             dir.string(), " ", names, " 2>&1");
    Made made;
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) return made;
    char buffer[4096];
    for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) made.output.append(buffer, n);
    const int status = pclose(pipe);
    made.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return made;
  };
  const Made failed = make("localhost,1.2.3.4.5");
  EXPECT_EQ(failed.exit_code, 1) << failed.output;
  EXPECT_THAT(failed.output, HasSubstr("bad ip address")) << failed.output;
  EXPECT_TRUE(fs::is_empty(dir)) << "a failed run left files in " << dir;

  const Made made = make("localhost,127.0.0.1");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  EXPECT_TRUE(LoadTransportSecurity(Tls((dir / "ca.pem").string(), (dir / "server.pem").string(),
                                        (dir / "server.key").string()),
                                    TlsRole::kServer)
                  .ok());
  fs::remove(dir / "server.pem");
  const Made partial = make("localhost,127.0.0.1");
  EXPECT_EQ(partial.exit_code, 1) << partial.output;
  EXPECT_THAT(partial.output, HasSubstr("but not server.pem; --force makes a new set"));
}

// The client's key, encrypted with the passphrase "secret" (PKCS#8).
std::string EncryptedKey(const std::string& key_path) {
  std::ifstream in(key_path);
  const std::string pem((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  KeyPtr key = ReadPemPrivateKey(pem);
  if (key == nullptr) return "";
  BIO* out = BIO_new(BIO_s_mem());
  char secret[] = "secret";
  std::string encrypted;
  if (PEM_write_bio_PKCS8PrivateKey(out, key.get(), EVP_aes_256_cbc(), secret, 6, nullptr,
                                    nullptr) == 1) {
    char* data = nullptr;
    const long size = BIO_get_mem_data(out, &data);  // NOLINT(runtime/int): OpenSSL's type
    encrypted.assign(data, static_cast<size_t>(size));
  }
  BIO_free(out);
  return encrypted;
}

// An encrypted key is refused naming it, and its passphrase is not asked
// for: a process with no terminal and the passphrase on its stdin (where
// OpenSSL's default prompt reads it) still refuses the key.
TEST_F(TransportSecurityTest, AnEncryptedKeyIsRefusedWithoutAskingForItsPassphrase) {
  const std::string encrypted = EncryptedKey(File("job", "client.key"));
  ASSERT_THAT(encrypted, HasSubstr("ENCRYPTED PRIVATE KEY"));
  const v1::SecurityConfig config =
      Tls(File("job", "ca.pem"), File("job", "client.pem"), Write("encrypted.key", encrypted));
  int passphrase[2];
  ASSERT_EQ(pipe(passphrase), 0);
  ASSERT_EQ(write(passphrase[1], "secret\n", 7), 7);
  close(passphrase[1]);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setsid();  // no controlling terminal: a prompt would read stdin
    dup2(passphrase[0], STDIN_FILENO);
    const absl::StatusOr<TransportSecurity> security =
        LoadTransportSecurity(config, TlsRole::kWorker);
    const bool refused = absl::IsInvalidArgument(security.status()) &&
                         absl::StrContains(security.status().message(), "security.key") &&
                         absl::StrContains(security.status().message(), "encrypted.key");
    _exit(refused ? 0 : 1);
  }
  close(passphrase[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the encrypted key was read, or refused naming no file";
}

TEST_F(TransportSecurityTest, ATokenMustBeLongAndPrintable) {
  struct Case {
    const char* name;
    std::string contents;
    const char* fragment;
  };
  const Case cases[] = {
      {"short", "abc\n", "has 3 characters; at least 16"},
      {"empty", "", "is empty"},
      {"inner space", "0123456789 abcdefghij\n", "printable ASCII without spaces"},
      {"control byte", std::string("0123456789abcdef\x01", 17), "printable ASCII"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::SecurityConfig config;
    config.set_token_file(Write("token", c.contents));
    absl::StatusOr<TransportSecurity> security = LoadTransportSecurity(config, TlsRole::kWorker);
    EXPECT_FALSE(security.ok());
    EXPECT_THAT(security.status().message(), AllOf(HasSubstr("security.token_file"),
                                                   HasSubstr(c.fragment)));
  }
  v1::SecurityConfig config;
  config.set_token_file(Write("token", "  0123456789abcdefXYZ  \nsecond line\n"));
  absl::StatusOr<TransportSecurity> security = LoadTransportSecurity(config, TlsRole::kWorker);
  ASSERT_TRUE(security.ok()) << security.status();
  EXPECT_EQ(security->token, "0123456789abcdefXYZ");
  EXPECT_FALSE(security->tls.has_value());
}

TEST(TokenMatchesTest, OnlyTheSameTokenMatches) {
  EXPECT_TRUE(TokenMatches("0123456789abcdef", "0123456789abcdef"));
  EXPECT_FALSE(TokenMatches("0123456789abcdef", "0123456789abcdeg"));
  EXPECT_FALSE(TokenMatches("0123456789abcdef", "0123456789abcde"));
  EXPECT_FALSE(TokenMatches("0123456789abcdef", "0123456789abcdef0"));
  EXPECT_FALSE(TokenMatches("0123456789abcdef", ""));
}

TEST(ExposureTest, OnlyLoopbackListensWithoutTlsAndToken) {
  for (const char* address : {"127.0.0.1:7000", "127.3.4.5:0", "localhost:7000", "[::1]:7000"}) {
    EXPECT_TRUE(IsLoopbackAddress(address)) << address;
    EXPECT_TRUE(CheckExposure(address, v1::SecurityConfig(), false).ok()) << address;
  }
  for (const char* address :
       {"0.0.0.0:7000", ":7000", "[::]:7000", "10.0.0.1:7000", "server-0:7000", "127.example:1",
        "128.0.0.1:7000"}) {
    EXPECT_FALSE(IsLoopbackAddress(address)) << address;
  }
  v1::SecurityConfig tls;
  tls.set_ca_cert("ca.pem");
  tls.set_cert("server.pem");
  tls.set_key("server.key");
  v1::SecurityConfig token;
  token.set_token_file("token");
  v1::SecurityConfig both = tls;
  both.set_token_file("token");

  absl::Status none = CheckExposure("0.0.0.0:7000", v1::SecurityConfig(), false);
  EXPECT_EQ(none.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.message(), AllOf(HasSubstr("0.0.0.0:7000"), HasSubstr("TLS and a token"),
                                    HasSubstr("--insecure"), HasSubstr("make_certs.sh")));
  EXPECT_THAT(CheckExposure("0.0.0.0:7000", tls, false).message(), HasSubstr("without a token"));
  EXPECT_THAT(CheckExposure("0.0.0.0:7000", token, false).message(), HasSubstr("without TLS"));
  EXPECT_TRUE(CheckExposure("0.0.0.0:7000", both, false).ok());
  EXPECT_TRUE(CheckExposure("0.0.0.0:7000", v1::SecurityConfig(), true).ok());
}

}  // namespace
}  // namespace cserps
