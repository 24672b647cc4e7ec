// Unit tests for the TCP data framing (src/transport/tcp/tcp_wire.h).
#include "transport/tcp/tcp_wire.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace mooncake::tcp {
namespace {

std::vector<uint8_t> Bytes(const uint8_t* p, size_t n) { return std::vector<uint8_t>(p, p + n); }

TEST(TcpWireTest, Constants) {
  EXPECT_EQ(kHeaderSize, 24u);
  EXPECT_EQ(kStatusSize, 8u);
  EXPECT_EQ(kOpRead, 0);
  EXPECT_EQ(kOpWrite, 1);
  EXPECT_EQ(kV2Flag, 0x80);
  EXPECT_EQ(kStatusMagic, 0x4D435456u);  // "MCTV"
  EXPECT_EQ(kStatusOk, 0u);
  EXPECT_EQ(kStatusAddrRejected, 1u);
}

TEST(TcpWireTest, EncodeHeaderByteLayout) {
  Header h;
  h.size = 0x0102030405060708ull;
  h.addr = 0x1112131415161718ull;
  h.op = kOpWrite;
  h.v2 = true;
  uint8_t out[kHeaderSize];
  std::memset(out, 0xAA, sizeof(out));  // padding must be overwritten with zeros
  EncodeHeader(h, out);
  const std::vector<uint8_t> expect = {
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // size, LE
      0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,  // addr, LE
      0x81,                                            // WRITE | v2
      0,    0,    0,    0,    0,    0,    0,           // padding
  };
  EXPECT_EQ(Bytes(out, kHeaderSize), expect);
}

TEST(TcpWireTest, OpcodeByte) {
  struct Case {
    uint8_t op;
    bool v2;
    uint8_t byte;
  };
  for (const Case& c : {Case{kOpRead, false, 0x00}, Case{kOpWrite, false, 0x01},
                        Case{kOpRead, true, 0x80}, Case{kOpWrite, true, 0x81}}) {
    Header h;
    h.size = 4096;
    h.addr = 0x7f0000001000ull;
    h.op = c.op;
    h.v2 = c.v2;
    uint8_t out[kHeaderSize];
    EncodeHeader(h, out);
    EXPECT_EQ(out[16], c.byte) << int(c.op) << " v2=" << c.v2;
    // The upstream v1 layout as a peer would build it by hand.
    uint8_t ref[kHeaderSize] = {0x00, 0x10, 0, 0, 0, 0, 0, 0, 0x00, 0x10, 0x00, 0x00, 0x00, 0x7f};
    ref[16] = c.byte;
    EXPECT_EQ(Bytes(out, kHeaderSize), Bytes(ref, kHeaderSize));
  }
}

TEST(TcpWireTest, DecodeRoundTrip) {
  for (uint8_t op : {kOpRead, kOpWrite}) {
    for (bool v2 : {false, true}) {
      for (uint64_t size : {uint64_t{0}, uint64_t{1}, uint64_t{1} << 40, UINT64_MAX}) {
        Header h;
        h.size = size;
        h.addr = ~size ^ 0x5a5a;
        h.op = op;
        h.v2 = v2;
        uint8_t buf[kHeaderSize];
        EncodeHeader(h, buf);
        Header d;
        ASSERT_TRUE(DecodeHeader(buf, &d));
        EXPECT_EQ(d.size, h.size);
        EXPECT_EQ(d.addr, h.addr);
        EXPECT_EQ(d.op, op);  // without the v2 flag
        EXPECT_EQ(d.v2, v2);
      }
    }
  }
}

TEST(TcpWireTest, DecodeFromRawBytes) {
  const uint8_t raw[kHeaderSize] = {0x00, 0x00, 0x10, 0, 0, 0, 0, 0,           // 1 MiB
                                    0x00, 0x20, 0x30, 0x40, 0x50, 0x7f, 0, 0,  // addr
                                    0x80, 0, 0, 0, 0, 0, 0, 0};                // READ v2
  Header h;
  ASSERT_TRUE(DecodeHeader(raw, &h));
  EXPECT_EQ(h.size, 1u << 20);
  EXPECT_EQ(h.addr, 0x7f5040302000ull);
  EXPECT_EQ(h.op, kOpRead);
  EXPECT_TRUE(h.v2);
}

TEST(TcpWireTest, UnknownOpcodeRejected) {
  for (int byte : {0x02, 0x03, 0x7f, 0x82, 0xff, 0x40, 0x41}) {
    uint8_t buf[kHeaderSize] = {};
    buf[0] = 1;
    buf[16] = static_cast<uint8_t>(byte);
    Header h;
    EXPECT_FALSE(DecodeHeader(buf, &h)) << "opcode byte 0x" << std::hex << byte;
  }
}

TEST(TcpWireTest, PaddingIgnoredOnDecode) {
  Header h;
  h.size = 77;
  h.addr = 0xdead000;
  h.op = kOpWrite;
  h.v2 = false;
  uint8_t buf[kHeaderSize];
  EncodeHeader(h, buf);
  for (size_t i = 17; i < kHeaderSize; ++i) buf[i] = static_cast<uint8_t>(0xF0 + i);
  Header d;
  ASSERT_TRUE(DecodeHeader(buf, &d));
  EXPECT_EQ(d.size, 77u);
  EXPECT_EQ(d.addr, 0xdead000u);
  EXPECT_EQ(d.op, kOpWrite);
  EXPECT_FALSE(d.v2);
}

TEST(TcpWireTest, StatusFrame) {
  uint64_t ok = EncodeStatus(kStatusOk);
  uint8_t b[8];
  std::memcpy(b, &ok, 8);
  // 0x4D435456_00000000 little-endian: code first, then "VTCM".
  EXPECT_EQ(Bytes(b, 8), (std::vector<uint8_t>{0, 0, 0, 0, 0x56, 0x54, 0x43, 0x4D}));

  uint64_t rej = EncodeStatus(kStatusAddrRejected);
  std::memcpy(b, &rej, 8);
  EXPECT_EQ(Bytes(b, 8), (std::vector<uint8_t>{1, 0, 0, 0, 0x56, 0x54, 0x43, 0x4D}));

  uint32_t code = 99;
  ASSERT_TRUE(DecodeStatus(ok, &code));
  EXPECT_EQ(code, kStatusOk);
  ASSERT_TRUE(DecodeStatus(rej, &code));
  EXPECT_EQ(code, kStatusAddrRejected);
  ASSERT_TRUE(DecodeStatus(EncodeStatus(0xfffffffe), &code));
  EXPECT_EQ(code, 0xfffffffeu);
  EXPECT_EQ(le64toh(EncodeStatus(5)), (uint64_t{0x4D435456} << 32) | 5);
}

TEST(TcpWireTest, WrongMagicRejected) {
  uint32_t code = 1234;
  for (uint64_t host : {uint64_t{0}, uint64_t{0x4D435457} << 32, uint64_t{0x564354D} << 32,
                        uint64_t{0x4D435456},  // magic in the low half
                        UINT64_MAX}) {
    EXPECT_FALSE(DecodeStatus(htole64(host), &code)) << std::hex << host;
  }
  // A v1 peer's first payload bytes are not a status frame.
  uint64_t data;
  std::memcpy(&data, "payload!", 8);
  EXPECT_FALSE(DecodeStatus(data, &code));
  EXPECT_EQ(code, 1234u);  // untouched on failure
}

}  // namespace
}  // namespace mooncake::tcp
