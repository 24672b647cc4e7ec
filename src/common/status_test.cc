// Unit tests for Status and Result<T> (include/mooncake/status.h).
#include "mooncake/status.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace mooncake {
namespace {

using Code = Status::Code;

TEST(StatusTest, DefaultAndOkAreOk) {
  Status a;
  Status b = Status::OK();
  EXPECT_TRUE(a.ok());
  EXPECT_TRUE(b.ok());
  EXPECT_EQ(a.code(), Code::kOk);
  EXPECT_TRUE(a.message().empty());
  EXPECT_EQ(a.ToString(), "OK");
  // "An OK status holds no allocation": the whole object is one (null) pointer.
  EXPECT_EQ(sizeof(Status), sizeof(void*));
}

TEST(StatusTest, ConstructingWithCodeOkIsOkAndDropsMessage) {
  Status s(Code::kOk, "ignored");
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "OK");
}

struct CodeCase {
  Status status;
  Code code;
  const char* name;
};

TEST(StatusTest, FactoriesSetCodeMessageAndName) {
  std::vector<CodeCase> cases;
  cases.push_back({Status::InvalidArgument("m"), Code::kInvalidArgument, "InvalidArgument"});
  cases.push_back({Status::NotFound("m"), Code::kNotFound, "NotFound"});
  cases.push_back({Status::AlreadyExists("m"), Code::kAlreadyExists, "AlreadyExists"});
  cases.push_back(
      {Status::FailedPrecondition("m"), Code::kFailedPrecondition, "FailedPrecondition"});
  cases.push_back({Status::Unavailable("m"), Code::kUnavailable, "Unavailable"});
  cases.push_back({Status::DeadlineExceeded("m"), Code::kDeadlineExceeded, "DeadlineExceeded"});
  cases.push_back(
      {Status::ResourceExhausted("m"), Code::kResourceExhausted, "ResourceExhausted"});
  cases.push_back({Status::Unimplemented("m"), Code::kUnimplemented, "Unimplemented"});
  cases.push_back({Status::PermissionDenied("m"), Code::kPermissionDenied, "PermissionDenied"});
  cases.push_back({Status::DataLoss("m"), Code::kDataLoss, "DataLoss"});
  cases.push_back({Status::Internal("m"), Code::kInternal, "Internal"});
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_FALSE(c.status.ok());
    EXPECT_EQ(c.status.code(), c.code);
    EXPECT_EQ(c.status.message(), "m");
    EXPECT_STREQ(CodeName(c.code), c.name);
    EXPECT_EQ(c.status.ToString(), std::string(c.name) + ": m");
  }
  EXPECT_STREQ(CodeName(Code::kOk), "OK");
}

TEST(StatusTest, NumericCodesAreStable) {
  EXPECT_EQ(static_cast<int>(Code::kOk), 0);
  EXPECT_EQ(static_cast<int>(Code::kInvalidArgument), 1);
  EXPECT_EQ(static_cast<int>(Code::kNotFound), 2);
  EXPECT_EQ(static_cast<int>(Code::kAlreadyExists), 3);
  EXPECT_EQ(static_cast<int>(Code::kFailedPrecondition), 4);
  EXPECT_EQ(static_cast<int>(Code::kUnavailable), 5);
  EXPECT_EQ(static_cast<int>(Code::kDeadlineExceeded), 6);
  EXPECT_EQ(static_cast<int>(Code::kResourceExhausted), 7);
  EXPECT_EQ(static_cast<int>(Code::kUnimplemented), 8);
  EXPECT_EQ(static_cast<int>(Code::kPermissionDenied), 9);
  EXPECT_EQ(static_cast<int>(Code::kDataLoss), 10);
  EXPECT_EQ(static_cast<int>(Code::kInternal), 11);
  EXPECT_STREQ(CodeName(static_cast<Code>(99)), "Unknown");
}

TEST(StatusTest, PredicatesMatchOnlyTheirCode) {
  EXPECT_TRUE(Status::InvalidArgument("").IsInvalidArgument());
  EXPECT_TRUE(Status::NotFound("").IsNotFound());
  EXPECT_TRUE(Status::Unavailable("").IsUnavailable());
  EXPECT_TRUE(Status::DeadlineExceeded("").IsDeadlineExceeded());
  EXPECT_TRUE(Status::FailedPrecondition("").IsFailedPrecondition());
  Status other = Status::DataLoss("x");
  EXPECT_FALSE(other.IsInvalidArgument());
  EXPECT_FALSE(other.IsNotFound());
  EXPECT_FALSE(other.IsUnavailable());
  EXPECT_FALSE(other.IsDeadlineExceeded());
  EXPECT_FALSE(other.IsFailedPrecondition());
  EXPECT_FALSE(Status::OK().IsNotFound());
}

TEST(StatusTest, EmptyMessageStillNotOk) {
  Status s = Status::Internal("");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.ToString(), "Internal: ");
}

TEST(StatusTest, WithContextPrefixesMessageAndKeepsCode) {
  Status s = Status::NotFound("no such buffer");
  Status c = s.WithContext("open segment x");
  EXPECT_EQ(c.code(), Code::kNotFound);
  EXPECT_EQ(c.message(), "open segment x: no such buffer");
  EXPECT_EQ(c.ToString(), "NotFound: open segment x: no such buffer");
  // The original is untouched.
  EXPECT_EQ(s.message(), "no such buffer");
  // Nested context.
  EXPECT_EQ(c.WithContext("outer").message(), "outer: open segment x: no such buffer");
  // OK stays OK with no message.
  Status ok = Status::OK().WithContext("ctx");
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.message(), "");
}

TEST(StatusTest, CopyIsDeep) {
  Status a = Status::Unavailable("peer down");
  Status b(a);
  EXPECT_EQ(b.code(), Code::kUnavailable);
  EXPECT_EQ(b.message(), "peer down");
  EXPECT_NE(&a.message(), &b.message());  // separate storage
  Status c = Status::DataLoss("x");
  c = a;
  EXPECT_EQ(c.ToString(), "Unavailable: peer down");
  // Assigning OK over an error clears it, and an error over OK sets it.
  c = Status::OK();
  EXPECT_TRUE(c.ok());
  Status d;
  d = a;
  EXPECT_EQ(d.code(), Code::kUnavailable);
  // Self-assignment keeps the value.
  Status& alias = d;
  d = alias;
  EXPECT_EQ(d.message(), "peer down");
  // Copying an OK status gives OK.
  Status ok_copy(Status::OK());
  EXPECT_TRUE(ok_copy.ok());
}

TEST(StatusTest, MoveTransfersAndIsNoexcept) {
  static_assert(std::is_nothrow_move_constructible_v<Status>);
  static_assert(std::is_nothrow_move_assignable_v<Status>);
  Status a = Status::Internal("bug");
  Status b(std::move(a));
  EXPECT_EQ(b.code(), Code::kInternal);
  EXPECT_EQ(b.message(), "bug");
  Status c;
  c = std::move(b);
  EXPECT_EQ(c.ToString(), "Internal: bug");
}

// --- Result<T> ---------------------------------------------------------------------------------

TEST(ResultTest, HoldsValue) {
  Result<int> r(42);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.status().ok());
  EXPECT_EQ(r.value(), 42);
  EXPECT_EQ(*r, 42);
  *r = 7;
  EXPECT_EQ(r.value(), 7);
}

TEST(ResultTest, HoldsError) {
  Result<std::string> r(Status::NotFound("gone"));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_EQ(r.status().message(), "gone");
}

// BUG (include/mooncake/status.h, Result(Status)): "a value or a non-OK Status", but a Result
// built from an OK Status (e.g. `return SomeCheck();` in a function returning Result<T>, when
// the check passes) reports ok() with no value, and value()/operator* then dereference an
// empty std::optional (undefined behaviour). abseil's StatusOr turns this into an Internal
// error; Result should not claim to hold a value it does not have.
TEST(ResultTest, BuiltFromOkStatusIsNotOk) {
  Result<int> r(Status::OK());
  EXPECT_FALSE(r.ok()) << "Result<int> from Status::OK() claims to hold a value";
  EXPECT_FALSE(r.status().ok());
}

TEST(ResultTest, ArrowAndMoveOnlyValues) {
  Result<std::string> s(std::string("hello"));
  EXPECT_EQ(s->size(), 5u);
  Result<std::unique_ptr<int>> p(std::make_unique<int>(5));
  ASSERT_TRUE(p.ok());
  std::unique_ptr<int> taken = std::move(p).value();
  ASSERT_NE(taken, nullptr);
  EXPECT_EQ(*taken, 5);
}

// --- macros ------------------------------------------------------------------------------------

int g_calls = 0;

Status Succeed() {
  ++g_calls;
  return Status::OK();
}
Status Fail(const std::string& m) {
  ++g_calls;
  return Status::PermissionDenied(m);
}

Status Chain(bool fail_first, bool* reached_end) {
  *reached_end = false;
  MC_RETURN_IF_ERROR(fail_first ? Fail("first") : Succeed());
  MC_RETURN_IF_ERROR(Succeed());
  *reached_end = true;
  return Status::OK();
}

TEST(StatusMacrosTest, ReturnIfErrorPropagatesAndShortCircuits) {
  bool end = false;
  g_calls = 0;
  EXPECT_TRUE(Chain(false, &end).ok());
  EXPECT_TRUE(end);
  EXPECT_EQ(g_calls, 2);

  g_calls = 0;
  Status s = Chain(true, &end);
  EXPECT_FALSE(end);
  EXPECT_EQ(g_calls, 1);  // evaluated once, the second call never made
  EXPECT_EQ(s.code(), Code::kPermissionDenied);
  EXPECT_EQ(s.message(), "first");
}

Result<int> Half(int x) {
  if (x % 2 != 0) return Status::InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  MC_ASSIGN_OR_RETURN(int h, Half(x));
  MC_ASSIGN_OR_RETURN(int q, Half(h));  // two uses in one function must not clash
  return q;
}

Status AssignExisting(int x, int* out) {
  int v = -1;
  MC_ASSIGN_OR_RETURN(v, Half(x));
  *out = v;
  return Status::OK();
}

Result<std::unique_ptr<int>> MakePtr(bool ok) {
  if (!ok) return Status::ResourceExhausted("none left");
  return std::make_unique<int>(9);
}

Status TakePtr(bool ok, int* out) {
  MC_ASSIGN_OR_RETURN(std::unique_ptr<int> p, MakePtr(ok));
  *out = *p;
  return Status::OK();
}

TEST(StatusMacrosTest, AssignOrReturn) {
  auto q = Quarter(12);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(*q, 3);

  auto bad1 = Quarter(7);
  EXPECT_EQ(bad1.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(bad1.status().message(), "odd: 7");
  auto bad2 = Quarter(6);  // 6 -> 3 -> odd
  EXPECT_EQ(bad2.status().message(), "odd: 3");

  int out = 0;
  EXPECT_TRUE(AssignExisting(10, &out).ok());
  EXPECT_EQ(out, 5);
  out = 0;
  EXPECT_TRUE(AssignExisting(3, &out).IsInvalidArgument());
  EXPECT_EQ(out, 0);

  int got = 0;
  EXPECT_TRUE(TakePtr(true, &got).ok());
  EXPECT_EQ(got, 9);
  Status s = TakePtr(false, &got);
  EXPECT_EQ(s.code(), Code::kResourceExhausted);
}

}  // namespace
}  // namespace mooncake
