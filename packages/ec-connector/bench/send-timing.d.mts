// Types of bench/send-timing.mjs: a side-effect module (it patches zeromq.js Socket.send).
export {};
