// The metrics endpoint over real sockets on 127.0.0.1.
#include "common/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

uint16_t PortOf(const std::string& address) {
  uint32_t port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) << address;
  return static_cast<uint16_t>(port);
}

int Connect(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` and reads until the server closes the connection.
std::string Exchange(uint16_t port, const std::string& request) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string reply;
  char buffer[4096];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) reply.append(buffer, n);
  close(fd);
  return reply;
}

TEST(MetricsHttpTest, ServesTheBodyMadeAtEachRequest) {
  std::atomic<int> calls{0};
  auto server = MetricsHttpServer::Start("127.0.0.1:0", [&calls] {
    return absl::StrCat("cserps_test_calls ", ++calls, "\n");
  });
  ASSERT_TRUE(server.ok()) << server.status();
  const uint16_t port = PortOf((*server)->address());
  ASSERT_NE(port, 0);
  EXPECT_THAT((*server)->address(), StartsWith("127.0.0.1:"));

  const std::string first = Exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(first, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(first, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(first, HasSubstr(absl::StrCat("Content-Length: ",
                                           std::string("cserps_test_calls 1\n").size(), "\r\n")));
  EXPECT_THAT(first, HasSubstr("\r\n\r\ncserps_test_calls 1\n"));
  // A query string is ignored; the body is made anew.
  EXPECT_THAT(Exchange(port, "GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
              HasSubstr("\r\n\r\ncserps_test_calls 2\n"));
}

TEST(MetricsHttpTest, OtherPathsMethodsAndHead) {
  auto server = MetricsHttpServer::Start("127.0.0.1:0", [] { return std::string("body\n"); });
  ASSERT_TRUE(server.ok()) << server.status();
  const uint16_t port = PortOf((*server)->address());
  EXPECT_THAT(Exchange(port, "GET / HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 404 "));
  EXPECT_THAT(Exchange(port, "POST /metrics HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 405 "));
  const std::string head = Exchange(port, "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_THAT(head, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(head, HasSubstr("Content-Length: 5\r\n"));
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n") << "HEAD must carry no body";
  // A request that never ends its headers is refused once too large.
  EXPECT_THAT(Exchange(port, "GET /metrics HTTP/1.1\r\nX: " + std::string(20000, 'a')),
              StartsWith("HTTP/1.1 431 "));
  // The server still answers after all of these.
  EXPECT_THAT(Exchange(port, "GET /metrics HTTP/1.1\r\n\r\n"), HasSubstr("\r\n\r\nbody\n"));
}

TEST(MetricsHttpTest, BadAddressesNameTheAddress) {
  auto body = [] { return std::string(); };
  auto no_port = MetricsHttpServer::Start("127.0.0.1", body);
  EXPECT_EQ(no_port.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_port.status().message(), HasSubstr("'127.0.0.1'"));

  auto taken = MetricsHttpServer::Start("127.0.0.1:0", body);
  ASSERT_TRUE(taken.ok()) << taken.status();
  auto again = MetricsHttpServer::Start((*taken)->address(), body);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(again.status().message(), HasSubstr((*taken)->address()));
  EXPECT_THAT(again.status().message(), HasSubstr("in use"));
}

// Clients that send their requests a piece at a time each hold a slot of
// their own, not the endpoint: a scrape meanwhile is answered, and so is
// each of them once its request is whole.
TEST(MetricsHttpTest, SlowClientsDoNotHoldAScrape) {
  auto server = MetricsHttpServer::Start("127.0.0.1:0", [] { return std::string("up 1\n"); });
  ASSERT_TRUE(server.ok()) << server.status();
  const uint16_t port = PortOf((*server)->address());
  std::vector<int> slow;
  for (int i = 0; i < 8; ++i) {
    const int fd = Connect(port);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(send(fd, "GET /met", 8, MSG_NOSIGNAL), 8);
    slow.push_back(fd);
  }
  EXPECT_THAT(Exchange(port, "GET /metrics HTTP/1.1\r\n\r\n"), HasSubstr("up 1"));
  for (const int fd : slow) {
    const std::string rest = "rics HTTP/1.1\r\n\r\n";
    EXPECT_EQ(send(fd, rest.data(), rest.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(rest.size()));
    std::string reply;
    char buffer[4096];
    for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;) reply.append(buffer, n);
    EXPECT_THAT(reply, StartsWith("HTTP/1.1 200 OK"));
    close(fd);
  }
}

TEST(MetricsHttpTest, StopsListeningWhenDestroyed) {
  auto server = MetricsHttpServer::Start("127.0.0.1:0", [] { return std::string(); });
  ASSERT_TRUE(server.ok()) << server.status();
  const uint16_t port = PortOf((*server)->address());
  server->reset();
  EXPECT_EQ(Connect(port), -1);
}

}  // namespace
}  // namespace cserps
