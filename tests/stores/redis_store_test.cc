// redis specifics: AUTH (password, ACL username), SELECT, and reconnecting after the server
// dropped the connection.
#include <thread>

#include "metadata/metadata_store.h"
#include "store_server.h"

namespace mooncake::testing {
namespace {

StoreOptions WithAuth(const std::string& user, const std::string& password, int db = 0) {
  StoreOptions o;
  o.redis_username = user;
  o.redis_password = password;
  o.redis_db_index = db;
  return o;
}

// A redis with a password, which also drops connections idle for over a second.
TEST(RedisStoreTest, AuthSelectAndReconnect) {
  MC_SERVER_OR_SKIP(server, "redis", "--requirepass s3cret --timeout 1");
  const std::string conn = server->ConnString();

  // Right password, with and without the ACL username.
  auto store = CreateMetadataStore(conn, WithAuth("", "s3cret"));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ASSERT_TRUE((*store)->Put("mooncake/test/auth", "v").ok());
  auto acl = CreateMetadataStore(conn, WithAuth("default", "s3cret"));
  ASSERT_TRUE(acl.ok()) << acl.status().ToString();
  EXPECT_EQ((*acl)->Get("mooncake/test/auth").value(), "v");

  // Wrong password, and none at all: PermissionDenied that says why.
  auto wrong = CreateMetadataStore(conn, WithAuth("", "nope"));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), Status::Code::kPermissionDenied) << wrong.status().ToString();
  EXPECT_NE(wrong.status().message().find("redis 127.0.0.1:"), std::string::npos);
  EXPECT_NE(wrong.status().message().find("AUTH failed"), std::string::npos)
      << wrong.status().ToString();
  auto none = CreateMetadataStore(conn, StoreOptions());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Status::Code::kPermissionDenied) << none.status().ToString();
  EXPECT_NE(none.status().message().find("NOAUTH"), std::string::npos);
  EXPECT_NE(none.status().message().find("MC_REDIS_PASSWORD"), std::string::npos);

  // SELECT: database 3 is apart from database 0.
  auto db3 = CreateMetadataStore(conn, WithAuth("", "s3cret", 3));
  ASSERT_TRUE(db3.ok()) << db3.status().ToString();
  EXPECT_TRUE((*db3)->Get("mooncake/test/auth").status().IsNotFound());
  ASSERT_TRUE((*db3)->Put("mooncake/test/db3", "three").ok());
  EXPECT_TRUE((*store)->Get("mooncake/test/db3").status().IsNotFound());

  // The server closes idle connections after 1 s; the next call reconnects (and
  // authenticates and selects again) without the caller seeing an error.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  auto r = (*db3)->Get("mooncake/test/db3");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "three");
  EXPECT_TRUE((*store)->Put("mooncake/test/auth", "w").ok());
  EXPECT_EQ((*store)->Get("mooncake/test/auth").value(), "w");
}

}  // namespace
}  // namespace mooncake::testing
